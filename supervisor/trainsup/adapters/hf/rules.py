"""Owns the fault rules of the Trainer's own wording, tried before the built-in table.

- ``nan_loss``: the per-step dict on stdout, ``{'loss': 'nan', ...}`` (transformers 5 prints its values as
  strings, earlier versions as numbers: ``{'loss': nan, ...}``).
- ``config_error``: ``TrainingArguments`` refusing bf16 on a machine without a GPU (TRL turns ``bf16`` on
  by default): ``ValueError: Your setup doesn't support bf16/gpu.`` (seen on the real bed), and the
  Trainer's ``Can't find a valid checkpoint at PATH`` for a resume path that is no checkpoint.
"""

from __future__ import annotations

from ...faults.rules import FaultRule

RULES: tuple[FaultRule, ...] = (
    FaultRule(
        id="nan_loss",
        patterns=(r"^\{'loss': '?nan'?,",),
        live=True,
        explanation="The training loss became NaN (the Trainer's per-step log); it keeps going but learns nothing.",
    ),
    FaultRule(
        id="config_error",
        patterns=(r"Your setup doesn't support bf16/gpu",),
        restartable=False,
        explanation="bf16 is on (TRL's default) and no GPU is there: pass --bf16 false (or --use_cpu) on a CPU.",
    ),
    FaultRule(
        id="config_error",
        patterns=(r"Can't find a valid checkpoint at ",),
        restartable=False,
        explanation="--resume_from_checkpoint names no checkpoint folder of the Trainer (a path, never "
        "'true' on the command line).",
    ),
)
