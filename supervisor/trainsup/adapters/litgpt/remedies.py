"""Owns the remedy ladders in LitGPT's terms and carrying out one action on a LitGPT plan.

A rung of another trainer's ladder (``--fp8_base``, ``--cache_latents``, ...) means nothing here:
``apply`` answers None and the engine skips the rung (journal ``remedy_skipped``). The built-in
ladders still drive the classes LitGPT has no ladder of its own for (a plain restart, fewer
DataLoader workers: ``--data.num_workers``).

Values chosen (each the smallest change that makes the run valid):

- ``lr_schedule``: LitGPT's cosine phase lasts ``lr_max_steps - warmup`` steps, so the warmup must be
  below the run's steps: ``--train.lr_warmup_steps`` becomes ``max_steps - 1`` when it was
  ``>= max_steps`` (the schedule closest to the one asked for: still warming up until the last
  step), ``1`` when it was 0, and half of itself when the run is limited by epochs (its step count
  is not on the command line). LitGPT restores the schedule from a saved state, so the corrected
  run starts from the beginning, into an out dir of its own (``states``).
- ``sequence_too_long``: ``--train.max_seq_length`` = the block size the error names (the ``block``
  group of the rule that recognised it; the line is read only for evidence without it: a user rule's,
  a journal's text).
- ``cuda_oom``: the allocator setting, then half the micro batch with the global batch kept
  (accumulation grows, the optimizer sees the same batch), then ``bf16-true``, then 4-bit weights
  (LoRA/adapter methods only).
"""

from __future__ import annotations

import re

from ...faults import remedies
from ...faults.remedies import Action, Rung, stop
from ...faults.verdict import NOTHING_SAID, Said
from ...trainers.base import apply_env, restart_with_same_settings
from .methods import SUGGESTED_PRECISIONS, VALID_PRECISIONS
from .plan import LitPlan
from .rules import CANNOT_ATTEND, LR_SCHEDULE, SEQUENCE_TOO_LONG

_WARMUP = "train.lr_warmup_steps"
_SEQ = "train.max_seq_length"
_MICRO, _GLOBAL = "train.micro_batch_size", "train.global_batch_size"
_ATTEND = re.compile(CANNOT_ATTEND)

LADDERS: dict[str, tuple[Rung, ...]] = {
    LR_SCHEDULE: (
        Rung((Action("add_flag", _WARMUP),)),
        Rung((Action("add_flag", _WARMUP),)),  # an epoch-limited run: halved once more
        stop("the LR schedule still divides by zero; set --train.lr_warmup_steps well below the run's "
             "optimizer steps (--train.max_steps, or epochs x steps per epoch)"),
    ),
    SEQUENCE_TOO_LONG: (
        Rung((Action("add_flag", _SEQ),)),
        stop("a sample is still longer than the model's context with --train.max_seq_length set"),
    ),
    "meta_tensor": (
        Rung((Action("add_flag", "lora_query", "true"), Action("add_flag", "lora_key", "true"),
              Action("add_flag", "lora_value", "true"))),
        Rung((Action("add_flag", "devices", "1"),)),
        stop("weights stayed on the meta device with LoRA on query, key and value and one device; "
             "check the checkpoint dir's lit_model.pth against its model_config.yaml"),
    ),
    "nan_loss": (
        Rung((Action("restart"),)),
        stop("the loss became NaN again after a restart (finetune_full/pretrain: from the last state saved "
             "before it; the other methods: from the beginning); lower the optimizer's learning rate or use "
             "--precision 32-true"),
    ),
    "cuda_oom": (
        Rung((Action("set_env", "PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),)),
        Rung((Action("halve_batch"),)),
        Rung((Action("add_flag", "precision", "bf16-true"),)),
        Rung((Action("add_flag", "quantize", "bnb.nf4"),)),
        stop("out of GPU memory after every memory remedy (micro batch 1, bf16-true, 4-bit weights "
             "where the method takes them)"),
    ),
}


def ladder(fault: str, plan: LitPlan) -> tuple[Rung, ...]:
    if fault == "config_error":
        return (stop(config_error_reason(plan)),)
    return remedies.ladder(fault, LADDERS)  # else the neutral default


def config_error_reason(plan: LitPlan) -> str:
    """Why a restart cannot help, naming what is wrong in this plan when it can be told."""
    precision = plan.value("precision")
    if precision is not None and precision not in VALID_PRECISIONS:
        return (f"--precision {precision!r} is invalid; LitGPT (Lightning Fabric) takes "
                f"{', '.join(SUGGESTED_PRECISIONS)} (also transformer-engine, transformer-engine-float16 "
                "and the legacy 64, 32, 16, bf16)")
    try:
        micro, glob = plan.get_int(_MICRO, plan.method.micro_batch_size), plan.get_int(_GLOBAL)
    except ValueError as exc:
        return str(exc)
    glob = plan.method.global_batch_size if glob is None else glob
    if micro is not None and glob < micro:
        return (f"--train.global_batch_size {glob} is smaller than --train.micro_batch_size {micro}; "
                f"set --train.global_batch_size {micro} (or a multiple of it)")
    return "the command or its files are wrong; a restart cannot fix it"


def apply_action(plan: LitPlan, action: Action, evidence: Said = NOTHING_SAID) -> str | None:
    """Apply one action to the plan; what changed in words, or None when it means nothing here."""
    if action.kind == "set_env":
        return apply_env(plan, action)
    if action.kind == "halve_batch":
        return _halve_micro_batch(plan)
    if action.kind == "lower_workers":
        return _lower_workers(plan, action.value)
    if action.kind == "add_flag":
        if action.name == _WARMUP:
            return _fix_warmup(plan)
        if action.name == _SEQ:
            return _max_seq_length(plan, evidence)
        if action.name in ("lora_query", "lora_key", "lora_value"):
            return _set_if(plan, action.name, "true", plan.method.lora, "false")
        if action.name == "devices":
            return _set_if(plan, "devices", action.value or "1", True, plan.method.devices)
        if action.name == "precision":
            return _bf16(plan)
        if action.name == "quantize":
            return _quantize(plan)
        return None  # another trainer's flag
    if action.kind == "remove_flag":
        return None  # the built-in ladders remove kohya flags only
    return restart_with_same_settings(action)


def _set_if(plan: LitPlan, key: str, value: str, takes: bool, default: str) -> str | None:
    if not takes or (plan.value(key) or default) == value:
        return None
    plan.set(key, value)
    return f"--{key} {value}"


def _fix_warmup(plan: LitPlan) -> str | None:
    warmup = plan.get_int(_WARMUP, plan.method.lr_warmup_steps)
    max_steps = plan.get_int("train.max_steps")
    if warmup is None:
        return None
    if warmup <= 0:
        new, why = 1, "0 divides by zero in the warmup"
    elif max_steps is not None and warmup >= max_steps:
        new, why = max_steps - 1, f"it must be below --train.max_steps {max_steps}"
    else:
        new, why = warmup // 2, "the run's epochs end before the warmup does"
    if new < 1 or new == warmup:
        return None
    plan.set(_WARMUP, str(new))
    return (f"--train.lr_warmup_steps {new} (was {warmup}: {why}); a fresh start from step 0, since LitGPT "
            "restores the LR schedule from a saved state and a resume would keep the old one")


def _max_seq_length(plan: LitPlan, evidence: Said) -> str | None:
    said = _attend(evidence)
    if said is None:
        return None
    tokens, block = said
    current = plan.get_int(_SEQ)
    if current is not None and current <= block:
        return None
    plan.set(_SEQ, str(block))
    return f"--train.max_seq_length {block} (a sample has {tokens} tokens; the model's block size is {block})"


def _attend(evidence: Said) -> tuple[int, int] | None:
    """The sample's tokens and the model's block size: the groups of LitGPT's rule, else (a user
    rule's match, a journal's text) read from the line."""
    groups = evidence.groups
    if "tokens" in groups and "block" in groups:
        tokens, block = groups["tokens"], groups["block"]
    else:
        m = _ATTEND.search(evidence.line or "")
        if m is None:
            return None
        tokens, block = m.group("tokens"), m.group("block")
    try:
        return int(tokens), int(block)
    except ValueError:  # a user rule's group of that name that holds no number
        return None


def _halve_micro_batch(plan: LitPlan) -> str | None:
    micro = plan.get_int(_MICRO, plan.method.micro_batch_size) or 1
    if micro <= 1:
        return None
    glob = plan.get_int(_GLOBAL, plan.method.global_batch_size) or micro
    plan.set(_MICRO, str(micro // 2))
    return (f"--train.micro_batch_size {micro // 2} (was {micro}; --train.global_batch_size stays {glob}, so "
            f"gradient accumulation goes from {max(1, glob // micro)} to {max(1, glob // (micro // 2))} iterations)")


def _bf16(plan: LitPlan) -> str | None:
    if plan.value("precision") in ("bf16-true", "16-true", "transformer-engine", "transformer-engine-float16"):
        return None
    plan.set("precision", "bf16-true")
    return "--precision bf16-true (weights and activations in bfloat16)"


def _quantize(plan: LitPlan) -> str | None:
    if not plan.method.quantize or plan.value("quantize") not in (None, "null", "None"):
        return None
    plan.set("quantize", "bnb.nf4")
    extra = ""
    if "mixed" in (plan.value("precision") or "mixed"):  # LitGPT refuses quantization with mixed precision
        plan.set("precision", "bf16-true")
        extra = " and --precision bf16-true (LitGPT refuses quantization with mixed precision)"
    return f"--quantize bnb.nf4 (4-bit base weights){extra}"


def _lower_workers(plan: LitPlan, value: str | None) -> str | None:
    current = plan.get_int("data.num_workers", plan.method.num_workers) or 0
    target = current // 2 if value == "half" else int(value or 0)
    if target >= current:
        return None
    plan.set("data.num_workers", str(target))
    return f"--data.num_workers {target} (was {current})"
