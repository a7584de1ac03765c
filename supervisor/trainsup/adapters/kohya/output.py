"""Owns what sd-scripts' output lines mean to the engine: the ``steps`` bar, accelerate's state-save
lines, the start-up summary, the phases that print but move no step, and the success marker
(the line formats themselves are ``faults.matchers``, which ``diagnose`` reads too).

An epoch's first line (``epoch 3/10``) reads as "look on disk": whatever the trainer does at the
previous epoch's end (its state, then its epoch samples) is done by then."""

from __future__ import annotations

import re

from ...faults import matchers
from ...trainers.base import OutputFormat

_EPOCH_START = re.compile(r"^\s*epoch (\d+)/\d+\s*$")


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

    def progress(self, line: str) -> matchers.Progress | None:
        return matchers.parse_progress(line)

    def is_plain_redraw(self, line: str) -> bool:
        # A bar redraw carries no fault evidence; only the newest is parsed.
        return line.endswith("]") and "nan" not in line

    def state_completed(self, line: str) -> str | None:
        found = matchers.state_completed(line)
        if found is None and (epoch := _EPOCH_START.match(line)) is not None:
            self.epoch_started = int(epoch.group(1))
            return ""  # the previous epoch's end is behind it: look on disk
        return found

    def state_started(self, line: str) -> int | None:
        return matchers.state_started(line)

    def is_success(self, line: str) -> bool:
        return matchers.is_success(line)

    def batches_per_epoch(self, line: str) -> int | None:
        return matchers.batches_per_epoch(line)

    def grad_accum(self, line: str) -> int | None:
        return matchers.grad_accum_steps(line)
