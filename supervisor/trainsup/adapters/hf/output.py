"""Owns what the Trainer's output lines mean: its progress bar, and nothing that announces a save.

The training bar is tqdm's with no description, on stderr, redrawn with ``\\r``: `` 50%|█████     |
10/20 [00:00<00:00, 41.60it/s]``. Its count is the true global step (a resumed run's bar jumps from
``0/20`` to ``11/20``). Other bars carry a description (``Writing model shards:``, ``Map:``,
``Loading weights:``) and are no training progress; the evaluation bar has none either, so only a bar
whose total is the run's ``max_steps`` counts (the first total seen, when the steps are not known). The
family's format for a log of an unknown trainer (``diagnose``) reads no bar without a known total: a bar
without a description is every sampler's too (ComfyUI's).

The per-step dicts on stdout (``{'loss': '6.191', ..., 'epoch': '1.375'}``) carry no step number; a NaN
loss there is the rule's (``rules``). A save prints no line naming it (with the default log level), so
the engine looks on disk (``announces_states`` False). Any line shows the trainer alive: loading and
tokenizing can take minutes before the bar starts.
"""

from __future__ import annotations

import re

from ...faults.progress import Progress
from ...trainers.base import OutputFormat

_BAR = re.compile(r"^\s*(?:\x1b\[A)?\s*(?P<pct>\d{1,3})%\|[^|]*\|\s*(?P<step>\d+)/(?P<total>\d+)\s*"
                  r"\[[^\],]*(?:,\s*(?P<rate>[\d.]+)(?P<unit>it/s|s/it))?[^\]]*\]\s*$")


class HfOutput(OutputFormat):
    progress_hint = "%|"
    any_line_is_activity = True
    announces_states = False
    absolute_steps = True

    def __init__(self, guess_total: bool = True) -> None:
        self.guess_total = guess_total  # False: a bar counts only against a known max_steps
        self.begin(None)

    def begin(self, total: int | None) -> None:
        """A new attempt: the run's ``max_steps`` when the command says it."""
        self.total = total
        self._seen_total: int | None = None

    def _match(self, line: str) -> re.Match[str] | None:
        m = _BAR.match(line)
        if m is None:
            return None
        total = int(m.group("total"))
        expected = self.total or self._seen_total
        if expected is None:
            if not self.guess_total:
                return None
            self._seen_total = total  # the training bar is the first without a description
        elif total != expected:
            return None  # the evaluation bar
        return m

    def progress(self, line: str) -> Progress | None:
        m = self._match(line)
        if m is None:
            return None
        rate = None
        if m.group("rate"):
            value = float(m.group("rate"))
            rate = value if m.group("unit") == "it/s" else (1.0 / value if value > 0 else None)
        return Progress(int(m.group("step")), int(m.group("total")), rate, None)

    def is_plain_redraw(self, line: str) -> bool:
        m = _BAR.match(line)
        expected = self.total or self._seen_total
        return m is not None and (int(m.group("total")) == expected if expected else self.guess_total)


def unknown_log_format() -> HfOutput:
    """The format ``diagnose`` reads a log of an unknown trainer with (``TrainerFamily.output``)."""
    return HfOutput(guess_total=False)
