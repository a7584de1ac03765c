"""Owns deciding whether a saved kohya state directory is complete and safe to resume from.

kohya writes its ``train_state.json`` and then accelerate's ``save_state`` directory (the shared
``trainers.accelerate``: model.safetensors, optimizer.bin, scheduler.bin, [scaler.pt,]
random_states_0.pkl), with no completion marker and nothing atomic. A state counts only when every
file exists, ``train_state.json`` parses, and ``model.safetensors`` is whole (``accelerate``).
A trainer of another dialect (musubi-tuner) writes no ``train_state.json``: its state is accelerate's
files alone, one ``random_states_N.pkl`` per process last, and a step state's label is in its name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ...trainers import accelerate
from ...trainers.accelerate import check_safetensors
from .dialect import KOHYA, Dialect
from .profile import parse_state_name


@dataclass(frozen=True)
class StateCheck:
    path: Path
    ok: bool
    reason: str  # "" when ok
    label_step: int | None = None  # current_step from train_state.json (the trainer's own label)
    epoch: int | None = None


def check_state(path: Path, need_scaler: bool = False, dialect: Dialect = KOHYA, processes: int = 1) -> StateCheck:
    """Whether ``path`` is a complete state; ``processes``: how many ``random_states_N.pkl`` it needs."""
    if not path.is_dir():
        return StateCheck(path, False, "not a directory")
    files = accelerate.required_files(first=dialect.state_first, processes=max(1, processes))
    missing = accelerate.missing_file(path, [*files, *([accelerate.SCALER] if need_scaler else [])])
    if missing:
        return StateCheck(path, False, missing)
    if "train_state.json" not in dialect.state_first:
        problem = check_safetensors(path / "model.safetensors")
        if problem:
            return StateCheck(path, False, problem)
        parsed = parse_state_name(path.name)  # a step state's name holds its label; others: the caller's
        return StateCheck(path, True, "", parsed[2] if parsed and parsed[1] == "step" else None)
    try:
        train_state = json.loads((path / "train_state.json").read_text())
        step = int(train_state["current_step"])
        epoch = int(train_state.get("current_epoch", 0))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return StateCheck(path, False, f"train_state.json unreadable ({exc})")
    problem = check_safetensors(path / "model.safetensors")
    if problem:
        return StateCheck(path, False, problem)
    return StateCheck(path, True, "", step, epoch)


def state_dirs(output_dir: Path, names: set[str]) -> list[Path]:
    """State dirs in ``output_dir`` written under one of these output names (kohya naming)."""
    found = []
    try:
        entries = list(output_dir.iterdir())
    except OSError:
        return []
    for entry in entries:
        parsed = parse_state_name(entry.name)
        if parsed and parsed[0] in names and entry.is_dir():
            found.append(entry)
    return sorted(found)
