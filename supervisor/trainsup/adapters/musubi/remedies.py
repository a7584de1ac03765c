"""Owns musubi-tuner's remedy ladders: the memory flags its README and its bed show working
(``--gradient_checkpointing``; ``--fp8_base`` with ``--fp8_scaled``, never ``--fp8_base`` alone: it
fails at the first step where the time embedding meets float8 weights; ``--blocks_to_swap N``,
CUDA only; ``--split_attn``), the batch halved in a derived copy of the dataset TOML (musubi's batch
size lives only there), the resolution lowered last (a derived dataset TOML with the latents made again
in the run dir by musubi's caching script: ``recache``), data-loader workers. It has no ``--lowram`` and
no caching flags: a fault sd-scripts answers by dropping a cache is not answered here. Other faults take
sd-scripts' ladders where their flags exist in musubi (``--ddp_timeout`` in minutes, for a collective timeout).
"""

from __future__ import annotations

from ...faults import remedies
from ...faults.remedies import RESTART, Action, Rung, stop
from ..kohya.remedies import HALVE_BATCH, lower_workers
from ..kohya.remedies import LADDERS as KOHYA_LADDERS

FP8 = (Action("add_flag", "fp8_base"), Action("add_flag", "fp8_scaled"))
# Every dataset's resolution times 3/4 in a derived dataset TOML, its latents made again in the run dir
# (``recache``): the last memory lever, since it changes what the model learns from (never below 256 px).
LOWER_RESOLUTION = Action("lower_resolution", value="0.75", says="lower the dataset's resolution by a quarter in a "
                          "derived copy (its latents cached again into the run dir)")

LADDERS: dict[str, tuple[Rung, ...]] = {
    **{k: v for k, v in KOHYA_LADDERS.items() if k in ("shm_exhausted", "nan_loss", "hang", "nccl_timeout")},
    "cuda_oom": (
        Rung((Action("set_env", "PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),)),
        Rung((Action("add_flag", "gradient_checkpointing"),)),
        Rung(FP8),
        Rung((HALVE_BATCH,)),
        Rung((Action("add_flag", "blocks_to_swap", "10"),)),
        Rung((Action("add_flag", "split_attn"),)),
        Rung((LOWER_RESOLUTION,)),
        stop("out of GPU memory after every memory remedy"),
    ),
    "host_oom_killed": (
        Rung((lower_workers("half"),)),
        Rung((Action("add_flag", "gradient_checkpointing"),)),
        RESTART,
    ),
    "fp8_op_unsupported": (
        # --fp8_base alone leaves float8 weights for autocast to cast; where it does not (the CPU's
        # float32 time embedding, seen on the real bed), --fp8_scaled's own Linear forward does, and
        # keeps the float8 memory saving the user asked for (a rung skipped when it is already there).
        Rung((Action("add_flag", "fp8_scaled"),), when=r"same dtype"),
        Rung((Action("remove_flag", "fp8_base"), Action("remove_flag", "fp8_scaled"))),
        stop("an op without a float8 kernel is still hit with --fp8_base off"),
    ),
}


def ladder(fault: str) -> tuple[Rung, ...]:
    return remedies.ladder(fault, LADDERS)
