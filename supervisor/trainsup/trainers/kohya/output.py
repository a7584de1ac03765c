"""Owns what sd-scripts' output lines mean to the engine: the ``steps`` bar, accelerate's state-save
lines, the start-up summary, the phases that print but move no step, and the success marker
(the line formats themselves are ``faults.matchers``, which ``diagnose`` reads too)."""

from __future__ import annotations

import re

from ...faults import matchers
from ..base import OutputFormat


class KohyaOutput(OutputFormat):
    progress_hint = "steps:"
    # A cheap gate: only lines holding one of these reach a matcher.
    bookkeeping = re.compile("Random states saved|saving state at step|model saved\\.|resume training from|"
                             "num batches per epoch|gradient accumulation steps|generating sample images|"
                             "saving checkpoint: ")
    phase_starts = (("generating sample images", "sampling"), ("saving checkpoint: ", "saving"),
                    ("saving state at step", "saving"))
    any_line_is_activity = False
    absolute_steps = False  # its bar counts from where a resume started
    announces_states = True  # accelerate's `Random states saved in ...`: the state's last file

    def progress(self, line: str) -> matchers.Progress | None:
        return matchers.parse_progress(line)

    def is_plain_redraw(self, line: str) -> bool:
        # A bar redraw carries no fault evidence; only the newest is parsed.
        return line.endswith("]") and "nan" not in line

    def state_completed(self, line: str) -> str | None:
        return matchers.state_completed(line)

    def state_started(self, line: str) -> int | None:
        return matchers.state_started(line)

    def is_success(self, line: str) -> bool:
        return matchers.is_success(line)

    def batches_per_epoch(self, line: str) -> int | None:
        return matchers.batches_per_epoch(line)

    def grad_accum(self, line: str) -> int | None:
        return matchers.grad_accum_steps(line)
