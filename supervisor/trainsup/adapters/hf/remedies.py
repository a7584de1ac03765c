"""Owns the remedy ladders in the Trainer's terms and carrying out one action on an ``HfPlan``.

- ``cuda_oom``: the allocator setting, then the per-device batch divided by its smallest prime factor
  (halved when even) with ``gradient_accumulation_steps`` multiplied by it, so the optimizer sees the
  same effective batch (``per_device_train_batch_size`` x accumulation); then gradient checkpointing
  (``--gradient_checkpointing true``; TRL has it on by default, so there the rung means nothing).
- ``bf16_unsupported`` (bf16 asked for where there is no GPU: TRL's default on a CPU): ``--bf16 false``.
- ``nccl_timeout`` (a collective timed out, NCCL's or gloo's, while every rank lived: one rank was busy
  elsewhere, in a save or an evaluation only it does, longer than the process group's timeout): ``--ddp_timeout``
  (seconds; the Trainer's default 1800) raised four times, from the command's value or what the evidence says
  the group had; then a plain restart. transformers gives the process group that timeout except under
  ``--use_cpu`` (5.x drops it there).
- ``config_error`` stops: a restart cannot fix the command.

A YAML front-end gets the same edits in its derived YAML (axolotl names the batch ``micro_batch_size``).
Actions of other trainers' ladders mean nothing here: ``apply`` answers None and the rung is skipped.
"""

from __future__ import annotations

from ...faults import remedies
from ...faults.remedies import RESTART, TIMEOUT_FACTOR, Action, Rung, collective_timeout_s, raised_timeout_s, stop
from ...faults.verdict import NOTHING_SAID, Said
from ...trainers.base import apply_env, restart_with_same_settings
from .plan import HfPlan, is_off, is_true
from .rules import BF16_UNSUPPORTED

BATCH, ACCUM, CHECKPOINTING = "per_device_train_batch_size", "gradient_accumulation_steps", "gradient_checkpointing"
DEFAULT_BATCH = 8  # TrainingArguments' default per-device batch
DDP_TIMEOUT, DEFAULT_DDP_TIMEOUT_S = "ddp_timeout", 1800  # seconds, TrainingArguments' default

LADDERS: dict[str, tuple[Rung, ...]] = {
    BF16_UNSUPPORTED: (
        Rung((Action("add_flag", "bf16", "false", says="add --bf16 false (no GPU here: the Trainer refuses bf16)"),)),
        stop("the Trainer still refuses bf16 with --bf16 false; check --bf16_full_eval and the config's bf16"),
    ),
    "nccl_timeout": (
        Rung((Action("raise_timeout", value=str(TIMEOUT_FACTOR),
                     says=f"raise --ddp_timeout (seconds, times {TIMEOUT_FACTOR})"),), repeat=True),
        RESTART,
    ),
    "cuda_oom": (
        Rung((Action("set_env", "PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),)),
        Rung((Action("halve_batch"),)),
        Rung((Action("add_flag", CHECKPOINTING, "true", says="add --gradient_checkpointing true"),)),
        stop("out of GPU memory with a per-device batch of 1 and gradient checkpointing on; try a LoRA "
             "(--use_peft) or a smaller --max_length"),
    ),
}


def ladder(fault: str, plan: HfPlan) -> tuple[Rung, ...]:
    if fault == "config_error":
        return (stop("the command or its files are wrong for the Trainer; a restart cannot fix it"),)
    return remedies.ladder(fault, LADDERS)


def _smallest_factor(n: int) -> int:
    f = 2
    while f * f <= n:
        if n % f == 0:
            return f
        f += 1
    return n


def halve_batch(plan: HfPlan) -> str | None:
    """The per-device batch divided, the accumulation multiplied by the same factor; None at batch 1."""
    try:
        batch = plan.get_int(BATCH)
        accum = plan.get_int(ACCUM) or 1
    except ValueError:
        return None
    if batch is None:
        if plan.front_end == "axolotl":
            return None  # axolotl has no default of its own to halve
        batch = DEFAULT_BATCH
    if batch <= 1:
        return None
    factor = _smallest_factor(batch)
    plan.set(BATCH, batch // factor)
    plan.set(ACCUM, accum * factor)
    b, a = plan.key(BATCH), plan.key(ACCUM)
    return f"--{b} {batch // factor} (was {batch}) and --{a} {accum * factor} (was {accum}): the same effective batch"


def gradient_checkpointing_on(plan: HfPlan) -> bool:
    value = plan.value(CHECKPOINTING)
    if value is None:
        return plan.front_end == "trl"  # TRL's configs default it on
    return is_true(value)


def raise_ddp_timeout(plan: HfPlan, factor: float, evidence: Said) -> str | None:
    """``--ddp_timeout`` (seconds) raised ``factor`` times (see ``remedies.raised_timeout_s``)."""
    try:
        current = plan.get_int(DDP_TIMEOUT)
    except ValueError:
        return None
    raised = int(raised_timeout_s(current, DEFAULT_DDP_TIMEOUT_S, evidence, factor))
    plan.set(DDP_TIMEOUT, raised)
    said = collective_timeout_s(evidence)
    was = (f"was {current}" if current is not None else f"the process group had {said:g} s" if said is not None
           else f"the Trainer's default is {DEFAULT_DDP_TIMEOUT_S}")
    return f"--{plan.key(DDP_TIMEOUT)} {raised} ({was}): a rank was busy longer than the collective timeout"


def apply_action(plan: HfPlan, action: Action, evidence: Said = NOTHING_SAID) -> str | None:
    if action.kind == "raise_timeout":
        return raise_ddp_timeout(plan, float(action.value or TIMEOUT_FACTOR), evidence)
    if action.kind == "set_env":
        return apply_env(plan, action)
    if action.kind == "halve_batch":
        return halve_batch(plan)
    if action.kind == "add_flag":
        if action.name == CHECKPOINTING:
            if gradient_checkpointing_on(plan):
                return None
            plan.set(CHECKPOINTING, True)
            return action.describe()
        if action.name == "bf16":
            if plan.value("bf16") is not None and is_off(plan.value("bf16")):
                return None
            plan.set("bf16", False)
            return action.describe()
        return None  # no other trainer's flag means anything here
    return restart_with_same_settings(action)
