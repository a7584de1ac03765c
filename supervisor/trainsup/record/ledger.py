"""Owns the exact step ledger across attempts: which state holds which absolute step.

kohya labels saves after a resume with the wrong step (with ``--skip_until_initial_step`` the global
step restarts at the position inside the epoch), and its ``train_state.json`` repeats that label.
The ledger records, per attempt, the output name it wrote under and the offset between its labels
and absolute steps, so every state maps to its true step. It is persisted atomically in the run dir.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .fsutil import atomic_write_text


@dataclass
class AttemptRecord:
    attempt: int
    output_name: str | None
    resume_step: int  # absolute step the attempt started from (0 = from scratch)
    offset: int | None  # absolute = label + offset; None until the start-up summary was seen
    started: float | None = None  # time.time() at launch: files older than this are not its own
    skips: bool = True  # launched with kohya's --skip_until_initial_step (mid-epoch label arithmetic)
    batches: int | None = None  # batches per epoch, from the start-up summary
    grad_accum: int | None = None


@dataclass
class StateRecord:
    dir: str
    step: int  # absolute
    attempt: int
    label: int  # the trainer's own label


@dataclass
class Ledger:
    path: Path
    attempts: list[AttemptRecord] = field(default_factory=list)
    states: list[StateRecord] = field(default_factory=list)
    bad_states: list[str] = field(default_factory=list)  # never resume from these

    @classmethod
    def load(cls, path: Path) -> Ledger:
        """The ledger a previous supervisor of this run dir left (it may have died mid-run), or an
        empty one; an unreadable ledger is set aside, never overwritten in place."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return cls(path, [AttemptRecord(**a) for a in data.get("attempts", [])],
                       [StateRecord(**s) for s in data.get("states", [])], list(data.get("bad_states", [])))
        except FileNotFoundError:
            return cls(path)
        except (OSError, ValueError, TypeError, AttributeError):
            try:
                path.replace(path.with_name(f"{path.name}.unreadable"))
            except OSError:
                pass
            return cls(path)

    def save(self) -> None:
        data = {"attempts": [asdict(a) for a in self.attempts],
                "states": [asdict(s) for s in self.states], "bad_states": self.bad_states}
        try:
            atomic_write_text(self.path, json.dumps(data, indent=2) + "\n")
        except OSError:
            pass  # the ledger lives in memory too; a full disk must not end supervision

    def attempt(self, n: int) -> AttemptRecord:
        for a in self.attempts:
            if a.attempt == n:
                return a
        raise KeyError(n)

    def record_state(self, dir_: Path, attempt: int, label: int) -> StateRecord | None:
        rec = self.attempt(attempt)
        if rec.offset is None:
            return None
        for s in self.states:
            if s.dir == str(dir_):
                return s
        state = StateRecord(str(dir_), label + rec.offset, attempt, label)
        self.states.append(state)
        self.save()
        return state

    def step_of(self, dir_: Path) -> int | None:
        for s in self.states:
            if s.dir == str(dir_):
                return s.step
        return None

    def moved(self, old: Path, new: Path) -> None:
        """A state dir was moved (out of the output dir's sight): follow it."""
        for s in self.states:
            if s.dir == str(old):
                s.dir = str(new)
        self.bad_states = [str(new) if b == str(old) else b for b in self.bad_states]
        self.save()

    def per_epoch(self) -> int | None:
        """Optimizer steps per epoch, as the newest attempt's start-up summary said."""
        for a in reversed(self.attempts):
            if a.batches:
                ga = a.grad_accum or 1
                return math.ceil(a.batches / ga)
        return None

    def mark_bad(self, dir_: Path) -> None:
        if str(dir_) not in self.bad_states:
            self.bad_states.append(str(dir_))
            self.save()


def label_offset(resume_step: int, skip_until_initial_step: bool, batches_per_epoch: int,
                 grad_accum: int = 1) -> int:
    """absolute - label for an attempt resumed at ``resume_step``, by kohya's own arithmetic.

    With ``--skip_until_initial_step`` kohya skips whole epochs (``initial_step * grad_accum //
    ceil(batches / grad_accum)`` of them), subtracting ``batches`` per skipped epoch, and starts its
    global step at what is left. Without it the global step restarts at 0.
    """
    if resume_step <= 0:
        return 0
    if not skip_until_initial_step:
        return resume_step
    initial = resume_step * grad_accum
    per_epoch = math.ceil(batches_per_epoch / grad_accum)
    epochs_skipped = initial // per_epoch if per_epoch else 0
    return resume_step - (initial - epochs_skipped * batches_per_epoch)
