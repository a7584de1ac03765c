"""Owns what LitGPT's output lines mean: progress, the phases the hang clock needs, and when a
step folder is finished.

One line per iteration: ``Epoch 1 | iter 12 step 12 | loss train: 6.148, val: 6.153 | iter time:
14.83 ms (step)`` (``(step)`` on the iteration that stepped the optimizer; pretrain appends
``remaining time: ...``). The step is the optimizer step, the number in the state folders' names.

No line says that a save finished: LoRA and adapter saves print nothing, and ``finetune_full`` /
``pretrain`` print ``Saving checkpoint to '...'`` *before* writing. A save happens right after the
log line (and the validation) of a step that is a multiple of ``--train.save_interval``, inside the
training loop; so the next iteration's line, or ``Final evaluation`` after the loop, means that save
is over. ``state_completed`` then answers ``StateSaved()`` (look on disk), and the state store checks the folder.

``Validating ...`` starts an evaluation with a sampled answer (the hang clock's "sampling" phase);
``Saving checkpoint to`` starts "saving". Both end when a later step shows.
"""

from __future__ import annotations

import math
import re

from ...faults.progress import Progress
from ...trainers.base import OutputFormat, StateSaved

_PROGRESS = re.compile(
    r"Epoch (?P<epoch>\d+) \| iter (?P<iter>\d+) step (?P<step>\d+) \| loss train: (?P<loss>\S+?),"
    r" val: \S+ \| iter time: (?P<ms>[\d.]+) ms(?P<stepped> \(step\))?")
_SAVING = "Saving checkpoint to "
_VALIDATING = "Validating ..."
_LOOP_OVER = "Final evaluation |"


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return math.nan if text.lower() == "nan" else None


class LitOutput(OutputFormat):
    progress_hint = "| iter "
    bookkeeping = re.compile(r"\| iter \d+ step \d+ \||Saving checkpoint to |Validating \.\.\.|Final evaluation \|")
    phase_starts = ((_SAVING, "saving"), (_VALIDATING, "sampling"))
    any_line_is_activity = False
    announces_states = True  # the line after a save announces it (see the module doc)

    def __init__(self) -> None:
        self.begin(None, None, 1)

    def begin(self, total: int | None, save_interval: int | None, accum: int, announced: bool = True) -> None:
        """A new attempt: its run length, save interval and gradient accumulation (for the rate).
        ``announced`` False: not every iteration prints its line (``--train.log_interval``), so the
        line after a save may never come; the engine then looks on disk as training goes on."""
        self.total, self.save_interval, self.accum = total, save_interval, max(1, accum)
        self.announces_states = announced
        self._pending: int | None = None  # the iteration after whose line a save is under way
        self._last_iter = 0

    def _match(self, line: str) -> re.Match[str] | None:
        return _PROGRESS.search(line) if "| iter " in line else None

    def progress(self, line: str) -> Progress | None:
        m = self._match(line)
        if m is None:
            return None
        ms = float(m.group("ms"))
        # one iteration's time over the accumulation: optimizer steps per second, for the ETA
        rate = 1000.0 / (ms * self.accum) if ms > 0 else None
        return Progress(int(m.group("step")), self.total or 0, rate, _float(m.group("loss")))

    def state_completed(self, line: str) -> StateSaved | None:
        if _LOOP_OVER in line:  # after the training loop: its last save is over
            return self._over()
        if _SAVING in line:
            if self._pending is None:
                self._pending = self._last_iter
            return None
        m = self._match(line)
        if m is None:
            return None
        it, step = int(m.group("iter")), int(m.group("step"))
        answer: StateSaved | None = None
        if self._pending is not None and it > self._pending:
            self._pending, answer = None, StateSaved()  # look on disk: the state store finds and checks the folder
        self._last_iter = it
        if m.group("stepped") and self.save_interval and step % self.save_interval == 0:
            self._pending = it  # this step saves after its line (and its validation)
        return answer

    def _over(self) -> StateSaved | None:
        if self._pending is None:
            return None
        self._pending = None
        return StateSaved()
