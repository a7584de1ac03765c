"""Owns what musubi-tuner's output lines mean beyond sd-scripts' (``kohya.output``, which it shares:
the ``steps`` bar with ``avr_loss``, ``saving checkpoint:``, accelerate's ``Random states saved in``
as a state's last line, ``epoch N/M``, ``model saved.`` at the end; its logging is plain
``LEVEL:logger:message`` on stderr, never rich-wrapped).

The start-up summary also says ``total optimization steps / ...: N``, its last line: the steps a run
of ``--max_train_epochs`` trains, which a resume must count down from.
"""

from __future__ import annotations

import re

from ...trainers.base import SummaryLine
from ..kohya.output import GRAD_ACCUM, KohyaOutput, grad_accum_steps

_TOTAL = re.compile(r"total optimization steps / \S+: (?P<n>\d+)")
TOTAL_STEPS = "total_steps"


class MusubiOutput(KohyaOutput):
    def summary(self, line: str) -> SummaryLine | None:
        m = _TOTAL.search(line)
        if m is not None:
            return SummaryLine({TOTAL_STEPS: int(m.group("n"))}, complete=True)
        n = grad_accum_steps(line)
        if n is not None:
            return SummaryLine({GRAD_ACCUM: n})  # not its last line: the total follows
        return super().summary(line)
