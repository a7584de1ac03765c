"""Owns the diffusers scripts' remedies: each fault's ladder in their own flags, and how one action
edits the command.

The memory flags every diffusers example script takes: ``--gradient_checkpointing``,
``--mixed_precision`` (the script's flag overrides accelerate's config), ``--train_batch_size`` halved
with ``--gradient_accumulation_steps`` doubled (the same samples per optimizer step), and
``--dataloader_num_workers`` for shared or host memory; a flag whose package is missing is dropped.
A fault without a ladder here takes the neutral one (``faults.remedies``).
"""

from __future__ import annotations

from ...faults import remedies
from ...faults.remedies import RESTART, Action, Rung, stop
from ...trainers.base import restart_with_same_settings
from ...trainers.cmdline import TrainerCommand
from .rules import FLAG_NEEDS_PACKAGE

HALVE_BATCH = Action("halve_batch", says="halve --train_batch_size and double --gradient_accumulation_steps")
BF16 = Action("add_flag", "mixed_precision", "bf16")
_STORE_TRUE = frozenset({"gradient_checkpointing", "allow_tf32", "use_8bit_adam",
                         "enable_xformers_memory_efficient_attention"})


def _workers(to: str) -> Action:
    return Action("lower_workers", value=to, says=f"lower --dataloader_num_workers (to {to})")


LADDERS: dict[str, tuple[Rung, ...]] = {
    # A flag whose package is missing: drop that flag (PyTorch's own attention; AdamW in 32 bits, which
    # needs more memory: said in the remedy's words). Each rung answers its own wording only.
    FLAG_NEEDS_PACKAGE: (
        Rung((Action("remove_flag", "enable_xformers_memory_efficient_attention"),), when=r"xformers"),
        Rung((Action("remove_flag", "use_8bit_adam",
                     says="remove --use_8bit_adam (bitsandbytes is missing: AdamW in 32 bits, more memory)"),),
             when=r"bitsandbytes"),
        stop("a flag of the command needs a package its environment lacks; install it in the trainer's venv"),
    ),
    "cuda_oom": (
        Rung((Action("set_env", "PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),)),
        Rung((Action("add_flag", "gradient_checkpointing"),)),
        Rung((BF16,)),
        Rung((HALVE_BATCH,)),
        stop("out of GPU memory after every memory remedy"),
    ),
    "host_oom_killed": (
        Rung((_workers("half"),)),
        Rung((Action("add_flag", "gradient_checkpointing"),)),
        RESTART,
    ),
    "shm_exhausted": (
        Rung((_workers("half"),)),
        Rung((_workers("0"),)),
        stop("shared memory is exhausted even without DataLoader workers; enlarge /dev/shm"),
    ),
}


def ladder(fault: str) -> tuple[Rung, ...]:
    return remedies.ladder(fault, LADDERS)


def apply_action(cmd: TrainerCommand, env: dict[str, str], action: Action, launcher_precision: bool) -> str | None:
    """Apply one action to the command (or ``env``); what changed in words, or None when it means
    nothing here. ``launcher_precision``: the launcher itself sets a mixed precision."""
    if action.kind == "add_flag":
        if action.name == "mixed_precision":
            # Only a run in full float32 gains memory from it; another precision the user chose stays.
            if cmd.get("mixed_precision") not in (None, "no") or launcher_precision:
                return None
        elif cmd.has(action.name):
            return None
        if action.name in _STORE_TRUE:
            cmd.set(action.name)
        else:
            cmd.set(action.name, action.value or "")
        return action.describe()
    if action.kind == "remove_flag":
        return action.describe() if cmd.remove(action.name) else None
    if action.kind == "set_env":
        if env.get(action.name) == action.value:
            return None
        env[action.name] = action.value or ""
        return action.describe()
    if action.kind == "halve_batch":
        batch = cmd.get_int("train_batch_size")
        if batch is None or batch <= 1:
            return None  # the script's own default differs per script: never guessed
        accum = cmd.get_int("gradient_accumulation_steps") or 1
        cmd.set("train_batch_size", str(batch // 2))
        cmd.set("gradient_accumulation_steps", str(accum * 2))
        return f"--train_batch_size {batch // 2}, --gradient_accumulation_steps {accum * 2}"
    if action.kind == "lower_workers":
        current = cmd.get_int("dataloader_num_workers") or 0  # the scripts' default: 0
        target = current // 2 if action.value == "half" else int(action.value or 0)
        if target >= current:
            return None
        cmd.set("dataloader_num_workers", str(target))
        return f"--dataloader_num_workers {target}"
    return restart_with_same_settings(action)
