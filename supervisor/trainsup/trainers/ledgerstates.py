"""Owns what every adapter's resume points share: claiming a complete state for the attempt that
wrote it (ledger, journal ``state_saved``), the steps an attempt's states prove, marking states
saved at or after a NaN, and choosing the newest safe state to resume from.

Adapters say which states may be resumed from at all (``resumable``) and whether one is still sound
on disk (``usable``); everything else is the same for sd-scripts, LitGPT and a declared trainer.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..record.journal import Journal
from ..record.ledger import Ledger, StateRecord
from ..record.textfmt import shown_path
from .base import Plan


class LedgerStates:
    # A claimed state is said at once, unless the adapter moves it just after (``announce`` then):
    # a path on the console is never one about to move.
    announce_on_claim = True

    def __init__(self, ledger: Ledger, journal: Journal, say: Callable[[str], None]) -> None:
        self.ledger, self.journal, self.say = ledger, journal, say
        self.attempt = 0
        self.resume_step = 0

    def claim(self, path: Path, label: int) -> StateRecord | None:
        """Enter a complete state of this attempt in the ledger (by the trainer's own label)."""
        state = self.ledger.record_state(path, self.attempt, label)
        if state is not None:
            self.journal.event("state_saved", dir=state.dir, step=state.step, label=state.label,
                               attempt=self.attempt)
            if self.announce_on_claim:
                self.announce(state)
        return state

    def announce(self, state: StateRecord, moves_later: str | None = None) -> None:
        """``step 8 is saved (out/.trainsup/saves/x-000001-state)``: where it stays; a state that is
        still to move (at the run's end) is said by its step and ``moves_later``, never its path."""
        self.say(f"step {state.step} is saved ({moves_later or shown_path(state.dir)})")

    def steps_proven(self) -> int:
        """Steps this attempt trained, as its saved states prove them."""
        return max([0] + [s.step - self.resume_step for s in self.ledger.states if s.attempt == self.attempt])

    def save_failed(self, label: int) -> None:
        """A save the trainer announced failed half-way: a store whose saves are named by label
        marks what it left bad (``ResumePoints``); one that checks every state on disk need not."""

    def mark_tainted(self, from_step: int) -> None:
        """Saved at or after a NaN: never a resume point."""
        for state in self.ledger.states:
            if state.attempt == self.attempt and state.step >= from_step:
                self.ledger.mark_bad(Path(state.dir))

    run_complete = False  # the last step's state is complete: stop the trainer, the run is done
    relaunch_at_state = False  # an exact resume point is complete: stop the trainer and resume from it

    def newest(self, nan_step: int | None = None, max_steps: int | None = None, plan: Plan | None = None,
               accept: Callable[[StateRecord], bool] = lambda _state: True) -> StateRecord | None:
        """The newest state the next launch of ``plan`` resumes from: never a bad one, never one
        saved at or after a NaN (``accept``: only among the states it takes)."""
        best: StateRecord | None = None
        for state in self.ledger.states:
            if state.dir in self.ledger.bad_states or (nan_step is not None and state.step >= nan_step):
                continue
            if not accept(state):
                continue
            if not self.resumable(state, max_steps, plan):
                continue
            if best is not None and (state.step, state.attempt) <= (best.step, best.attempt):
                continue
            if not self.usable(Path(state.dir), nan_step):
                continue
            best = state
        return best

    def resumable(self, state: StateRecord, max_steps: int | None, plan: Plan | None = None) -> bool:
        """Whether the next launch of ``plan`` (None: the last launched) may resume from this state
        at all (by its step, its attempt, what the plan changed since it was saved)."""
        return True

    def usable(self, path: Path, nan_step: int | None) -> bool:
        """Whether the state is still complete on disk (may mark it bad in the ledger)."""
        return True
