"""Owns the fault rules of the Trainer's own wording, tried before the built-in table.

- ``nan_loss``: the per-step dict on stdout, ``{'loss': 'nan', ...}`` (transformers 5 prints its values as
  strings, earlier versions as numbers: ``{'loss': nan, ...}``).
- ``bf16_unsupported`` (this adapter's own id): ``TrainingArguments`` refusing bf16 on a machine without a
  GPU (TRL turns ``bf16`` on by default) or with a card before Ampere: ``ValueError: Your setup doesn't
  support bf16/gpu.`` (seen on the real bed, before anything is written); its ladder turns bf16 off.
- ``config_error``: the Trainer's ``Can't find a valid checkpoint at PATH`` for a resume path that is no
  checkpoint.
"""

from __future__ import annotations

from ...faults.rules import FaultRule

BF16_UNSUPPORTED = "bf16_unsupported"

RULES: tuple[FaultRule, ...] = (
    FaultRule(
        id="nan_loss",
        patterns=(r"^\{'loss': '?nan'?,",),
        live=True,
        explanation="The training loss became NaN (the Trainer's per-step log); it keeps going but learns nothing.",
    ),
    FaultRule(
        id=BF16_UNSUPPORTED,
        patterns=(r"Your setup doesn't support bf16/gpu",),
        explanation="bf16 is on (TRL's default) and this machine cannot run it (no GPU, or a card before Ampere: "
        "V100, T4, 2080 Ti): the Trainer trains with --bf16 false.",
    ),
    FaultRule(
        id="config_error",
        patterns=(r"Can't find a valid checkpoint at ",),
        restartable=False,
        explanation="--resume_from_checkpoint names no checkpoint folder of the Trainer (a path, never "
        "'true' on the command line).",
    ),
)
