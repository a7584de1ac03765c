"""Owns what sd-scripts' output lines mean: the ``steps`` bar, accelerate's state-save lines, the
start-up summary, the phases that print but move no step, and the success marker (``model saved.``).
The fault scanner is given this format too (the run's, and ``diagnose``'s list of known formats), so
evidence the ``steps`` bar outlived is dropped.

An epoch's first line (``epoch 3/10``) reads as "look on disk": whatever the trainer does at the
previous epoch's end (its state, then its epoch samples) is done by then."""

from __future__ import annotations

import re

from ...faults.linetext import clean_line
from ...faults.progress import Progress
from ...trainers.base import OutputFormat, StateSaved, SummaryLine

_EPOCH_START = re.compile(r"^\s*epoch (\d+)/\d+\s*$")
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
# The start-up summary facts ``KohyaRun.on_summary`` reads (its step labels after a resume).
BATCHES_PER_EPOCH, GRAD_ACCUM = "batches_per_epoch", "grad_accum"


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
    """The success marker ends the line (read raw from a log too: cleaned only when it is there)."""
    return SUCCESS_MARKER in line and clean_line(line).rstrip().endswith(SUCCESS_MARKER)


class KohyaOutput(OutputFormat):
    progress_hint = "steps:"
    # A cheap gate: only lines holding one of these reach a matcher.
    bookkeeping = re.compile("Random states saved|saving state at step|model saved\\.|resume training from|"
                             "num batches per epoch|gradient accumulation steps|generating sample images|"
                             "saving checkpoint: |^\\s*epoch \\d+/")
    phase_starts = (("generating sample images", "sampling"), ("saving checkpoint: ", "saving"),
                    ("saving state at step", "saving"))
    any_line_is_activity = False
    absolute_steps = False  # its bar counts from where a resume started
    announces_states = True  # accelerate's `Random states saved in ...`: the state's last file
    epoch_started = 0  # the newest epoch this attempt began (written by the pump thread, an int)

    def progress(self, line: str) -> Progress | None:
        return parse_progress(line)

    def is_plain_redraw(self, line: str) -> bool:
        # A bar redraw carries no fault evidence; only the newest is parsed.
        return line.endswith("]") and "nan" not in line

    def state_completed(self, line: str) -> StateSaved | None:
        found = state_completed(line)
        if found is None and (epoch := _EPOCH_START.match(line)) is not None:
            self.epoch_started = int(epoch.group(1))
            return StateSaved()  # the previous epoch's end is behind it: look on disk
        return None if found is None else StateSaved(found or None)

    def state_started(self, line: str) -> int | None:
        return state_started(line)

    def is_success(self, line: str) -> bool:
        return is_success(line)

    def summary(self, line: str) -> SummaryLine | None:
        n = batches_per_epoch(line)
        if n is not None:
            return SummaryLine({BATCHES_PER_EPOCH: n})
        n = grad_accum_steps(line)
        # gradient accumulation is the summary's last fact kohya prints
        return SummaryLine({GRAD_ACCUM: n}, complete=True) if n is not None else None
