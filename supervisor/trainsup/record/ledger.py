"""Owns the exact step ledger across attempts: which state holds which absolute step.

A trainer may label the saves of a resumed attempt with a step of its own counting (one restarts
its count at each launch), so the ledger records, per attempt, the name it wrote under and the
offset between its labels and absolute steps, and every state maps to its true step. How an
offset is worked out is the adapter's: what it needs to remember of an attempt for that (facts from
the trainer's start-up output, how it was launched) it keeps in the attempt's ``notes``, which the
ledger stores and never reads. It is persisted atomically in the run dir.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from .fsutil import atomic_write_text


@dataclass
class AttemptRecord:
    attempt: int
    output_name: str | None
    resume_step: int  # absolute step the attempt started from (0 = from scratch)
    offset: int | None  # absolute = label + offset; None until the start-up summary was seen
    started: float | None = None  # time.time() at launch: files older than this are not its own
    notes: dict[str, Any] = field(default_factory=dict)  # the adapter's own facts of the attempt (plain JSON)

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> AttemptRecord:
        """An attempt as a ledger file holds it. A ledger written before ``notes`` existed kept the
        adapter's facts beside the ledger's own fields: any key the ledger does not know is the
        adapter's, so it goes into ``notes`` (a run dir from an earlier trainsup still resumes)."""
        own = {f.name for f in fields(cls)} - {"notes"}
        notes = dict(data.get("notes") or {})
        notes.update({k: v for k, v in data.items() if k not in own and k != "notes"})
        return cls(**{k: v for k, v in data.items() if k in own}, notes=notes)


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
            return cls(path, [AttemptRecord.from_data(a) for a in data.get("attempts", [])],
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

    def run_started(self) -> float | None:
        """When this run's first attempt began (its ledger's earliest start), None before any."""
        return min((a.started for a in self.attempts if a.started is not None), default=None)

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

    def mark_bad(self, dir_: Path) -> None:
        if str(dir_) not in self.bad_states:
            self.bad_states.append(str(dir_))
            self.save()

