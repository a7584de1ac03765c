"""Owns sd-scripts' remedy ladders: each fault class's rungs in kohya's own flags, worded in them.

A fault this table does not name falls back on the trainer-neutral ``faults.remedies.DEFAULT``.
The ladders follow the defaults in the project's fault table.
"""

from __future__ import annotations

from ...faults import remedies
from ...faults.remedies import RESTART, TIMEOUT_FACTOR, Action, Rung, stop


def _flags(kind: str, *names: str) -> tuple[Action, ...]:
    assert kind in ("add_flag", "remove_flag")
    return tuple(Action("add_flag", n) if kind == "add_flag" else Action("remove_flag", n) for n in names)


HALVE_BATCH = Action("halve_batch", says="halve --train_batch_size and double --gradient_accumulation_steps")


def lower_workers(to: str) -> Action:
    return Action("lower_workers", value=to, says=f"lower --max_data_loader_n_workers (to {to})")


# A collective timed out while every rank lived: rank 0 alone was caching latents or text-encoder outputs,
# sampling or saving for longer than the group's timeout (sd-scripts #971); --ddp_timeout is in minutes.
RAISE_DDP_TIMEOUT = Action("raise_timeout", value=str(TIMEOUT_FACTOR),
                           says=f"raise --ddp_timeout (minutes, times {TIMEOUT_FACTOR})")

LADDERS: dict[str, tuple[Rung, ...]] = {
    "nccl_timeout": (Rung((RAISE_DDP_TIMEOUT,), repeat=True), RESTART),  # raised again at each recurrence
    "meta_tensor": (
        Rung((Action("add_flag", "fp8_base"),)),
        stop("weights stayed on the meta device even with --fp8_base: the model or VAE/AE file's "
             "key layout does not match this script; check --pretrained_model_name_or_path and --ae/--vae"),
    ),
    "device_mismatch": (
        Rung(_flags("remove_flag", "cache_latents", "cache_latents_to_disk")),
        Rung(_flags("remove_flag", "cache_text_encoder_outputs", "cache_text_encoder_outputs_to_disk")),
        stop("tensors are still on two devices with latent and text-encoder caching off"),
    ),
    "te_cache_none": (
        Rung((Action("restart"),)),
        Rung(_flags("remove_flag", "cache_text_encoder_outputs", "cache_text_encoder_outputs_to_disk")),
        stop("sample prompts still find no text-encoder output with caching off"),
    ),
    "cuda_oom": (
        Rung((Action("set_env", "PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),)),
        Rung((Action("add_flag", "gradient_checkpointing"),)),
        Rung((Action("add_flag", "fp8_base"),)),
        Rung((HALVE_BATCH,)),
        Rung((Action("add_flag", "blocks_to_swap", "8"),)),
        stop("out of GPU memory after every memory remedy"),
    ),
    "shm_exhausted": (
        Rung((lower_workers("half"),)),
        Rung((lower_workers("0"),)),
        stop("shared memory is exhausted even without DataLoader workers; enlarge /dev/shm"),
    ),
    "nan_loss": (
        Rung((Action("restart"),)),
        stop("the loss became NaN again after resuming from the last state saved before it; "
             "lower --learning_rate"),
    ),
    "nan_latents": (
        Rung((Action("add_flag", "no_half_vae"),)),
        stop("NaN latents even with --no_half_vae"),
    ),
    "host_oom_killed": (
        Rung((lower_workers("half"),)),
        Rung((Action("add_flag", "lowram"),)),
        RESTART,
    ),
    "flag_conflict": (
        # Drop the caching flag the assertion names; never the augmentation the user asked for.
        Rung(_flags("remove_flag", "cache_latents", "cache_latents_to_disk"), when=r"(?i)caching latents|latent"),
        Rung(_flags("remove_flag", "cache_text_encoder_outputs", "cache_text_encoder_outputs_to_disk"),
             when=r"(?is)^(?!.*latent).*(?:text.?encoder|cach)"),
        stop("the trainer rejects this combination of options"),
    ),
    "fp8_op_unsupported": (
        Rung(_flags("remove_flag", "fp8_base", "fp8_base_unet")),
        stop("an op without a float8 kernel is still hit with --fp8_base off"),
    ),
    "hang": (
        Rung((Action("restart"),)),
        # A DataLoader worker that stopped delivering batches: load in the main process instead.
        Rung((lower_workers("0"),), when=r"DataLoader waits"),
        stop("it hung again after a restart; the stacks are in the run dir's hang-N.txt"),
    ),
}


def ladder(fault: str) -> tuple[Rung, ...]:
    return remedies.ladder(fault, LADDERS)
