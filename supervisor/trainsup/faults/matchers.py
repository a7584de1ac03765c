"""Owns recognising the trainer's progress and bookkeeping lines (pure functions of one cleaned line).

Formats follow kohya sd-scripts: the tqdm bar with desc ``steps``, accelerate's state-save lines, the
start-up summary, the resume lines and the success marker. Fault evidence lives in ``scanner``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# `steps:  10%|█   | 100/1000 [01:23<12:27,  1.20it/s, avr_loss=0.123]`; other bars have other descs.
_BAR = re.compile(
    r"(?<!\w)steps:\s*(?P<pct>\d+)%\|[^|]*\|\s*(?P<n>\d+)/(?P<total>\d+)\s*\[(?P<inner>[^\]]*)\]?"
)
_RATE = re.compile(r"(?P<num>[\d.]+|\?)\s*(?P<unit>it/s|s/it)")
_LOSS = re.compile(r"avr_loss=(?P<loss>[-+\w.]+)")
_STATE_DONE = re.compile(r"Random states saved in (?P<path>.+?)[/\\]random_states_\d+\.pkl")
_STATE_START = re.compile(r"saving state at step (?P<step>\d+)")
_BATCHES = re.compile(r"num batches per epoch / \S+: (?P<n>\d+)")
_GRAD_ACCUM = re.compile(r"gradient accumulation steps / \S+ = (?P<n>\d+)")
SUCCESS_MARKER = "model saved."


@dataclass(frozen=True)
class Progress:
    step: int
    total: int
    rate: float | None  # iterations per second
    loss: float | None


def parse_progress(line: str) -> Progress | None:
    """The last `steps` bar on the line (glued redraws keep only the newest)."""
    if "steps:" not in line:
        return None
    last = None
    for last in _BAR.finditer(line):
        pass
    if last is None:
        return None
    inner = last.group("inner") or ""
    rate = None
    m = _RATE.search(inner)
    if m and m.group("num") != "?":
        value = float(m.group("num"))
        rate = value if m.group("unit") == "it/s" else (1.0 / value if value else None)
    loss = None
    m = _LOSS.search(inner)
    if m:
        try:
            loss = float(m.group("loss"))
        except ValueError:
            loss = None
    return Progress(int(last.group("n")), int(last.group("total")), rate, loss)


def state_completed(line: str) -> str | None:
    """Directory of a state whose last file (`random_states_0.pkl`) was just written.

    ``""`` when the marker is there but its path is not (rich wrapped it onto the next rows, as it
    does when the user's COLUMNS is narrow): the caller then looks on disk.
    """
    if "Random states saved" not in line:
        return None
    m = _STATE_DONE.search(line)
    return m.group("path").strip() if m else ""


def state_started(line: str) -> int | None:
    m = _STATE_START.search(line)
    return int(m.group("step")) if m else None


def batches_per_epoch(line: str) -> int | None:
    m = _BATCHES.search(line)
    return int(m.group("n")) if m else None


def grad_accum_steps(line: str) -> int | None:
    m = _GRAD_ACCUM.search(line)
    return int(m.group("n")) if m else None


def is_success(line: str) -> bool:
    return line.rstrip().endswith(SUCCESS_MARKER)
