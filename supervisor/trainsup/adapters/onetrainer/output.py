"""Owns what OneTrainer's output means: the true global step from its tqdm bars, the phases the
hang clock needs, the backups it announces, the final ``Saving`` line and the NaN it reports.

tqdm draws on stderr, redrawn with ``\\r``; nested bars end in ``ESC[A``. The ``epoch`` bar counts
the epochs *left* (from the resumed epoch), the ``step`` bar the steps of the current epoch (from the
resumed epoch step) with a ``loss=…, smooth loss=…`` postfix. So the true step is
``(resumed epoch + epoch bar) * steps per epoch + step bar``, which is also the ``<global_step>`` in
a backup's name. ``print`` lines (``Creating Backup <dir>``, ``Saving <model>``) go to stdout.

No line says that a backup is finished (``Creating Backup`` comes before its files), so states are
looked for on disk while the bars move (``announces_states = False``). Other output may be glued to
a bar fragment (``…ESC[ATraceback (most recent call last):``): only a line that is a bar and nothing
else counts as a plain redraw, so glued evidence still reaches the fault scanner.
"""

from __future__ import annotations

import math
import re

from ...faults.progress import Progress
from ...trainers.base import OutputFormat, StateSaved

_ESC = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_STEP = re.compile(r"(?:^|(?<=[\s\]A]))step:\s+\d+%\|[^|]*\|\s*(?P<n>\d+)/(?P<total>\d+)\s*\[(?P<info>[^\]]*)\]")
_EPOCH = re.compile(r"(?:^|(?<=[\s\]A]))epoch:\s+\d+%\|[^|]*\|\s*(?P<n>\d+)/(?P<total>\d+)")
_RATE = re.compile(r"(?P<v>[\d.]+)(?P<unit>it/s|s/it)")
_LOSS = re.compile(r"(?<!smooth )loss=(?P<loss>[^,\]\s]+)")
_BACKUP = re.compile(r"Creating Backup (?P<dir>.*-backup-(?P<step>\d+)-\d+-\d+)\s*$")
NAN_LINE = "Training loss became NaN"
SAVING = "Saving "


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return math.nan if text.lower() == "nan" else None


class OTOutput(OutputFormat):
    progress_hint = "step:"
    bookkeeping = re.compile(r"epoch:\s+\d+%\||Creating Backup |^Saving |Training loss became NaN")
    phase_starts = (("Creating Backup ", "saving"), (SAVING, "saving"))
    any_line_is_activity = False
    announces_states = False
    absolute_steps = True

    def __init__(self) -> None:
        self.begin(0, None)

    def begin(self, start_epoch: int, output: str | None) -> None:
        """A new attempt: the epoch it resumes in (0 for a fresh start) and its output model path."""
        self.start_epoch, self.output = start_epoch, output
        self.epoch_n = 0
        self.epochs_left: int | None = None
        self.per_epoch: int | None = None
        self.last_backup_step: int | None = None  # the newest ``Creating Backup`` of this attempt
        self.saved_seen = False  # ``Saving <output model>`` was printed
        self.nan_seen = False

    def _plain(self, line: str) -> str:
        return _ESC.sub("", line).strip()

    def progress(self, line: str) -> Progress | None:
        m = None
        for m in _STEP.finditer(_ESC.sub(" ", line)):
            pass  # the newest redraw on a glued line
        if m is None:
            return None
        n, per_epoch = int(m["n"]), int(m["total"])
        self.per_epoch = per_epoch
        epoch = self.start_epoch + self.epoch_n
        total = (self.start_epoch + self.epochs_left) * per_epoch if self.epochs_left is not None else 0
        rate = None
        r = _RATE.search(m["info"])
        if r is not None and float(r["v"]) > 0:
            rate = float(r["v"]) if r["unit"] == "it/s" else 1.0 / float(r["v"])
        loss_m = _LOSS.search(m["info"])
        loss = _float(loss_m["loss"]) if loss_m else None
        return Progress(epoch * per_epoch + n, total, rate, loss)

    def is_plain_redraw(self, line: str) -> bool:
        plain = self._plain(line)
        m = _STEP.match(plain)
        return m is not None and m.end() == len(plain)

    def state_completed(self, line: str) -> StateSaved | None:
        """Reads every bookkeeping line (epoch bar, backup, save, NaN); never announces a state."""
        plain = self._plain(line)
        e = None
        for e in _EPOCH.finditer(_ESC.sub(" ", line)):
            pass
        if e is not None:
            self.epoch_n, self.epochs_left = int(e["n"]), int(e["total"])
        b = _BACKUP.search(plain)
        if b is not None:
            self.last_backup_step = int(b["step"])
        if plain.startswith(SAVING) and (self.output is None or plain[len(SAVING):].strip() == self.output):
            self.saved_seen = True
        if NAN_LINE in plain:
            self.nan_seen = True
        return None
