"""Owns what a diffusers example script's output lines mean: its tqdm ``Steps:`` bar as progress, the
start-up summary (examples, batch, accumulation, steps) from which the steps of an epoch follow,
and the lines of a checkpoint save.

Everything goes to stderr. The bar is redrawn with ``\\r`` (``Steps:  50%|#####     | 10/20 [00:08<00:04,
2.18it/s, lr=0.0001, step_loss=1.2]``); its count is the true global step, also after a resume. A save
starts with accelerate's ``Saving current state to OUT/checkpoint-N`` (glued to the bar's line: tqdm
leaves no newline) and ends with the script's ``Saved state to OUT/checkpoint-N``, printed after
accelerate wrote the state's last file: the console's completion line. There is no end-of-training
line; exit 0 is success.
"""

from __future__ import annotations

import math
import re

from ...faults.progress import Progress
from ...trainers.base import OutputFormat, StateSaved, SummaryLine

_BAR = re.compile(r"Steps:\s+\d+%\|[^|]*\|\s*(?P<step>\d+)/(?P<total>\d+)\s*\[(?P<inside>[^\]]*)\]?")
_RATE = re.compile(r"(?P<n>[\d.]+)(?P<unit>it/s|s/it)")
_LOSS = re.compile(r"step_loss=(?P<loss>[^,\]\s]+)")
_SAVED = re.compile(r"Saved state to (?P<dir>\S+)")
_SAVING = re.compile(r"Saving current state to (?P<dir>\S*?checkpoint-(?P<step>\d+))\s*$")

# The start-up summary (``***** Running training *****``), one fact a line.
EXAMPLES, BATCH, TOTAL_BATCH, GRAD_ACCUM, MAX_STEPS = "examples", "batch", "total_batch", "grad_accum", "max_steps"
_SUMMARY = (
    (re.compile(r"Num examples = (\d+)"), EXAMPLES),
    (re.compile(r"Instantaneous batch size per device = (\d+)"), BATCH),
    (re.compile(r"Total train batch size \(w\. parallel, distributed & accumulation\) = (\d+)"), TOTAL_BATCH),
    (re.compile(r"Gradient Accumulation steps = (\d+)"), GRAD_ACCUM),
    (re.compile(r"Total optimization steps = (\d+)"), MAX_STEPS),
)


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return math.nan if text.lower() == "nan" else None


def steps_per_epoch(facts: dict[str, int]) -> int | None:
    """Optimizer steps an epoch, as the script counts them: its data loader's batches per process
    (accelerate shards the batches over the processes) over the gradient accumulation."""
    examples, batch = facts.get(EXAMPLES), facts.get(BATCH)
    if not examples or not batch:
        return None
    accum = facts.get(GRAD_ACCUM) or 1
    total = facts.get(TOTAL_BATCH) or batch * accum
    processes = max(1, total // (batch * accum))
    batches = math.ceil(math.ceil(examples / batch) / processes)
    return math.ceil(batches / accum)


class DiffusersOutput(OutputFormat):
    progress_hint = "Steps:"
    bookkeeping = re.compile(r"Saved state to |Saving current state to |Num examples = |Instantaneous batch size"
                             r"|Total train batch size|Gradient Accumulation steps = |Total optimization steps = ")
    phase_starts = (("Saving current state to ", "saving"), ("Running validation", "sampling"))
    any_line_is_activity = False
    announces_states = True  # ``Saved state to`` follows the last file of every save

    def progress(self, line: str) -> Progress | None:
        m = _BAR.search(line)
        if m is None:
            return None
        inside = m.group("inside") or ""
        rate = None
        r = _RATE.search(inside)
        if r is not None:
            n = float(r.group("n"))
            rate = n if r.group("unit") == "it/s" else (1.0 / n if n > 0 else None)
        loss = _LOSS.search(inside)
        return Progress(int(m.group("step")), int(m.group("total")), rate,
                        _float(loss.group("loss")) if loss is not None else None)

    def is_plain_redraw(self, line: str) -> bool:
        return _BAR.fullmatch(line.strip()) is not None

    def state_completed(self, line: str) -> StateSaved | None:
        m = _SAVED.search(line)
        return StateSaved(m.group("dir")) if m is not None else None

    def state_started(self, line: str) -> int | None:
        m = _SAVING.search(line)
        return int(m.group("step")) if m is not None else None

    def summary(self, line: str) -> SummaryLine | None:
        for pattern, key in _SUMMARY:
            m = pattern.search(line)
            if m is not None:
                return SummaryLine({key: int(m.group(1))}, complete=key == MAX_STEPS)
        return None
