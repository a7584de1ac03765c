"""Owns OneTrainer's preflight findings: what in a ``scripts/train.py`` command and the files it names
would make the run fail or lose work, found by reading files only (the bed's README lists each
failure as the real trainer showed it)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from ...trainers.base import Finding
from .plan import OTPlan

EIGHT_BIT = "_8BIT"
LORA_FORMATS = ("KOHYA_LORA", "DIFFUSERS_LORA", "ORIGINAL_LORA", "COMFY_LORA", "LEGACY_LORA")


def check(plan: OTPlan, versions: Mapping[str, str | None]) -> list[Finding]:
    found: list[Finding] = []
    if not (plan.cwd / "scripts" / "train.py").is_file() and not (plan.cwd / "modules").is_dir():
        found.append(Finding("warning", "cwd", f"{plan.cwd} is not the OneTrainer root: scripts/train.py must be "
                             "run from there (it imports modules/ and writes relative paths under it)",
                             "cd to the OneTrainer checkout first"))
    if plan.value("__version") is None:
        found.append(Finding("blocker", "config_version", f'{plan.config_path} has no "__version": OneTrainer '
                             "migrates it as a version-0 config and fails (KeyError: 'weight_dtype')",
                             '"__version": 11'))
    found += _files(plan)
    method = str(plan.value("training_method") or "FINE_TUNE").upper()
    fmt = str(plan.value("output_model_format") or "SAFETENSORS").upper()
    if method == "LORA" and fmt not in LORA_FORMATS:
        found.append(Finding("blocker", "output_format", f"output_model_format {fmt} cannot hold a LoRA: OneTrainer "
                             "trains every step, then fails at the final save (Unsupported LoRA output format)",
                             '"output_model_format": "KOHYA_LORA"'))
    optimizer = plan.value("optimizer.optimizer")
    if isinstance(optimizer, str) and optimizer.upper().endswith(EIGHT_BIT) and "bitsandbytes" in versions \
            and versions.get("bitsandbytes") is None:
        found.append(Finding("blocker", "optimizer_backend", f"optimizer {optimizer} needs bitsandbytes, which the "
                             "trainer's Python lacks", '"optimizer": {"optimizer": "ADAMW"}'))
    backup = str(plan.value("backup_after_unit") or "NEVER").upper()
    if backup == "NEVER" or (plan.get_float("backup_after", 0.0) or 0.0) <= 0:
        found.append(Finding("warning", "no_backups", "backup_after_unit is NEVER (or backup_after 0): OneTrainer "
                             "saves no backup, so after a fault trainsup can only start from the beginning",
                             '"backup_after": 5, "backup_after_unit": "STEP" (or MINUTE)'))
    if plan.get_bool("continue_last_backup", False):
        found.append(Finding("info", "continue_last_backup", "continue_last_backup is on: OneTrainer takes the "
                             "last-named directory in backup/ unchecked; trainsup resumes from the newest complete "
                             "backup instead and moves later or partial ones aside"))
    return found


def _files(plan: OTPlan) -> list[Finding]:
    found: list[Finding] = []
    for key in ("concept_file_name", "sample_definition_file_name"):
        path = plan.path(key)
        if path is None:
            continue
        try:
            json.loads(Path(path).read_bytes())
        except FileNotFoundError:
            found.append(Finding("blocker", key, f"{key} {path} does not exist: OneTrainer fails at start "
                                 "(FileNotFoundError)", "fix the path, or inline the list in the config"))
        except (OSError, ValueError) as exc:
            found.append(Finding("blocker", key, f"{key} {path} is not valid JSON ({exc}): OneTrainer fails at "
                                 "start, even with sampling off", "fix the file, or inline the list in the config"))
    return found
