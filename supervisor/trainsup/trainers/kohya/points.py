"""Owns the run's resume points: which saved states belong to which attempt, and which one is safe.

An attempt claims only the complete states it wrote itself (validated, and newer than its launch,
so a same-named state of an earlier run is never mistaken for one of ours), maps their kohya
labels to absolute steps through the ledger, and names itself so it cannot overwrite what an
earlier attempt wrote. Choosing where to resume skips bad (half-saved) states and, after a NaN, any
state from the NaN step on or whose weights are not finite.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from ...record.fsutil import publish_copy
from ...record.journal import Journal
from ...record.ledger import AttemptRecord, Ledger, StateRecord, label_offset, post_resume_overshoot
from ..ledgerstates import LedgerStates
from .profile import final_weights_name, parse_state_name, state_dir_names, weights_files_for
from .states import check_state, state_dirs
from .weights import has_non_finite


def _names(output_name: str | None) -> set[str]:
    step, epoch, final = state_dir_names(output_name)
    return {step, epoch, final[: -len("-state")]}


class ResumePoints(LedgerStates):
    def __init__(self, ledger: Ledger, output_dir: Path, need_scaler: bool, journal: Journal,
                 say: Callable[[str], None], user_output_name: str | None = None) -> None:
        super().__init__(ledger, journal, say)
        self.output_dir, self.need_scaler = output_dir, need_scaler
        self.user_output_name = user_output_name  # where the final weights are published
        self.run_started = time.time()
        self.attempt_started = self.run_started
        self.output_name: str | None = None

    def continue_ledger(self) -> None:
        """A ledger left by an earlier supervisor of this run dir (it died, or was stopped): claim
        the complete states its last attempt saved (it may have died before it could), and count
        the run from its first launch, so nothing it wrote looks like the user's own."""
        if not self.ledger.attempts:
            return
        last = self.ledger.attempts[-1]
        self.attempt, self.output_name, self.resume_step = last.attempt, last.output_name, last.resume_step
        self.attempt_started = last.started if last.started is not None else self.run_started
        self.collect()
        self.run_started = min([a.started for a in self.ledger.attempts if a.started is not None]
                               + [self.run_started])

    # --- one attempt -----------------------------------------------------------------------------
    def begin(self, attempt: int, resume_step: int, output_name: str | None = None) -> None:
        self.attempt, self.output_name, self.resume_step = attempt, output_name, resume_step
        self.attempt_started = time.time()
        self.ledger.attempts.append(AttemptRecord(attempt, output_name, resume_step,
                                                  0 if resume_step == 0 else None, round(self.attempt_started, 3)))
        self.ledger.save()

    def summary(self, batches_per_epoch: int | None, grad_accum: int | None, max_train_steps: int) -> int:
        """Fix the attempt's label offset from the start-up summary; return kohya's overshoot."""
        rec = self.ledger.attempt(self.attempt)
        if rec.offset is not None or not batches_per_epoch:
            return 0
        ga = grad_accum or 1
        rec.offset = label_offset(rec.resume_step, True, batches_per_epoch, ga)
        self.ledger.save()
        return post_resume_overshoot(rec.resume_step, max_train_steps, batches_per_epoch, ga)

    def written_this_attempt(self, path: Path) -> bool:
        try:
            # whole seconds: some file systems keep coarse mtimes
            return path.stat().st_mtime >= int(self.attempt_started)
        except OSError:
            return False

    def final_written(self) -> bool:
        return self.written_this_attempt(self.output_dir / final_weights_name(self.output_name))

    def collect(self, only: Path | None = None) -> list[StateRecord]:
        """Enter this attempt's complete states in the ledger (disk is the truth, lines are hints)."""
        names = _names(self.output_name)
        recorded: list[StateRecord] = []
        for path in [only] if only is not None else state_dirs(self.output_dir, names):
            parsed = parse_state_name(path.name)
            if parsed is None or parsed[0] not in names or self.ledger.step_of(path) is not None:
                continue
            if not self.written_this_attempt(path / "random_states_0.pkl"):
                continue  # a state of an earlier run under the same name: not this attempt's to claim
            check = check_state(path, need_scaler=self.need_scaler)
            if not check.ok or check.label_step is None:
                continue
            state = self.claim(path, check.label_step)
            if state is not None:
                recorded.append(state)
        return recorded

    def mark_failed_save(self, label: int) -> None:
        """The state save at this label raised half-way: never resume from what it left."""
        step_name = state_dir_names(self.output_name)[0]
        self.ledger.mark_bad(self.output_dir / f"{step_name}-step{label:08d}-state")

    # --- across attempts -------------------------------------------------------------------------
    def wrote_under(self, output_name: str | None) -> bool:
        """Whether this run already wrote weights or states under that output name."""
        weights, names = weights_files_for(output_name), _names(output_name)
        try:
            entries = list(self.output_dir.iterdir())
        except OSError:
            return False
        for entry in entries:
            parsed = parse_state_name(entry.name)
            ours = weights.match(entry.name) or (parsed is not None and parsed[0] in names)
            try:
                if ours and entry.stat().st_mtime >= self.run_started:
                    return True
            except OSError:
                continue
        return False

    def adopt(self, path: Path) -> str:
        """Take the user's own ``--resume`` state as a resume point; '' or why it cannot be."""
        check = check_state(path)
        if not check.ok or check.label_step is None:
            return check.reason
        self.ledger.states.append(StateRecord(str(path), check.label_step, 0, check.label_step))
        self.journal.event("state_adopted", dir=str(path), step=check.label_step)
        return ""

    def resumable(self, state: StateRecord, max_steps: int | None) -> bool:
        """Never a state at ``max_steps`` or past it: kohya refuses ``--initial_step`` >=
        ``--max_train_steps``, so a fault after the last state, before the final weights, resumes one
        state earlier."""
        return max_steps is None or state.step < max_steps

    def usable(self, path: Path, nan_step: int | None) -> bool:
        if not check_state(path).ok:
            return False
        if nan_step is not None and has_non_finite(path / "model.safetensors"):
            self.ledger.mark_bad(path)
            return False
        return True

    def publish_final(self) -> str | None:
        """Put the final weights where the user's command says, when a renamed attempt wrote them."""
        want = self.output_dir / final_weights_name(self.user_output_name)
        got = self.output_dir / final_weights_name(self.output_name)
        if got != want and got.exists():
            publish_copy(got, want)
            self.journal.event("final_published", src=str(got), dst=str(want))
        return str(want) if want.exists() else None
