"""The soak's view of files: digests of a directory, the demo's state dirs and whether each is whole
(every file present; every file loads), saves caught half-written, the max abs diff of two weights
files, and the journal (`events.jsonl`) read line by line. Its idea of a complete state is its own,
not trainsup's: the checker must not share the checked code's."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from .params import STATE_FILES


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def digest_dir(root: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    found: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if rel.parts[0] in skip or not path.is_file():
            continue
        try:
            found[str(rel)] = sha256(path)
        except OSError:
            continue  # vanished while listed (a temp file of an atomic replace)
    return found


def state_dirs(out: Path) -> list[Path]:
    try:
        return sorted(p for p in out.iterdir() if p.name.endswith("-state") and p.is_dir())
    except OSError:
        return []


def has_all_files(state: Path) -> bool:
    return all((state / name).is_file() for name in STATE_FILES)


def state_problem(state: Path) -> str:
    """'' when every file of the state loads (torch for the .bin/.pkl, safetensors for the model)."""
    import torch
    from safetensors.numpy import load_file

    for name in STATE_FILES:
        path = state / name
        if not path.is_file():
            return f"{name} missing"
        try:
            if name.endswith(".json"):
                json.loads(path.read_text())
            elif name.endswith(".safetensors"):
                load_file(str(path))
            else:
                torch.load(path, map_location="cpu", weights_only=name != "random_states_0.pkl")
        except Exception as exc:  # noqa: BLE001 - any failure to load means the state is not whole
            return f"{name} does not load ({type(exc).__name__}: {str(exc)[:120]})"
    return ""


def in_progress(out: Path, rels: list[str]) -> set[str]:
    """Of these files, those a save was still writing: in a state dir without all its files, or a
    .safetensors whose header promises more bytes than the file holds."""
    from safetensors import safe_open

    busy = set()
    for rel in rels:
        path = out / rel
        if path.parent.name.endswith("-state") and not has_all_files(path.parent):
            busy.add(rel)
        elif rel.endswith(".safetensors"):
            try:
                with safe_open(str(path), framework="numpy") as fh:
                    fh.keys()
            except Exception:  # noqa: BLE001 - unreadable now: caught half-written
                busy.add(rel)
    return busy


def max_abs_diff(a: Path, b: Path) -> float:
    import numpy as np
    from safetensors.numpy import load_file

    wa, wb = load_file(str(a)), load_file(str(b))
    if sorted(wa) != sorted(wb):
        return float("inf")
    return max((float(np.max(np.abs(wa[k].astype(np.float64) - wb[k].astype(np.float64)))) for k in wa),
               default=0.0)


def read_events(run_dir: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The journal's events, and the lines that do not parse."""
    try:
        text = (run_dir / "events.jsonl").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return [], []
    events, bad = [], []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            events.append(json.loads(line))
        except ValueError:
            bad.append(line[:200])
    return events, bad


def read_ledger(run_dir: Path) -> dict[str, Any]:
    """trainsup's ledger of states and attempts ({} when it is missing or does not parse)."""
    try:
        data = json.loads((run_dir / "ledger.json").read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}
