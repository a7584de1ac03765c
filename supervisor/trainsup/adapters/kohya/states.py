"""Owns deciding whether a saved kohya state directory is complete and safe to resume from.

kohya writes a state with no completion marker and nothing atomic, in the order train_state.json,
model.safetensors, optimizer.bin, scheduler.bin, [scaler.pt,] random_states_0.pkl. A state counts
only when every file exists, ``train_state.json`` parses, and ``model.safetensors`` has a readable
header whose tensors all lie inside the file. No tensor is loaded and torch is never imported.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .profile import STATE_FILES, parse_state_name
from .sthead import HeaderError, load_header


@dataclass(frozen=True)
class StateCheck:
    path: Path
    ok: bool
    reason: str  # "" when ok
    label_step: int | None = None  # current_step from train_state.json (the trainer's own label)
    epoch: int | None = None


def check_safetensors(path: Path) -> str:
    """'' when the file's header parses and covers the file; else why not."""
    try:
        header = load_header(path)
        missing = header.missing_bytes()
    except HeaderError as exc:
        return f"{path.name}: {exc}"
    except OSError as exc:
        return f"{path.name}: unreadable header ({exc})"
    if missing:
        return f"{path.name}: truncated ({header.size} bytes, tensors need {header.size + missing})"
    return _library_check(path)


def _library_check(path: Path) -> str:
    """Also ask the safetensors library, when numpy is there for it (it needs a framework)."""
    try:
        import numpy  # noqa: F401
        from safetensors import safe_open
    except ImportError:
        return ""
    try:
        with safe_open(str(path), framework="numpy") as fh:
            fh.keys()
    except Exception as exc:  # noqa: BLE001 - the library raises its own SafetensorError types
        return f"{path.name}: safetensors refused it ({exc})"
    return ""


def check_state(path: Path, need_scaler: bool = False) -> StateCheck:
    if not path.is_dir():
        return StateCheck(path, False, "not a directory")
    needed = list(STATE_FILES) + (["scaler.pt"] if need_scaler else [])
    for name in needed:
        f = path / name
        if not f.is_file() or f.stat().st_size == 0:
            return StateCheck(path, False, f"{name} missing or empty")
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
