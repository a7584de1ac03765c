"""Owns "trained with": every change trainsup made to the user's recipe that shaped the weights a run
ends with, from which step, and why; computed from the journal at the run's end.

A change is an action of a ``remedy`` record that edits the launch (a flag added or removed, the batch
halved, an environment variable set, a serializer upgraded); a plain restart or a wait for other
programs' GPU memory changes nothing. Its reason is the ``fault`` record just before the remedy (class
and evidence line). Its first step is the resume step of the first attempt launched after it, lowered
by any later attempt that resumed from an earlier state while the change was applied.

A new supervisor of the run dir (``run_start`` again: after a stop, a crash or a hand-over) starts
from the user's plan: the changes earned before it are not applied from its first attempt on, so each
ran until the step that attempt resumed from (``until_step``; lowered in turn by a later resume from
an earlier state). One that ends where it began shaped nothing that was kept and is left out. An
environment upgrade (``environment_upgrade``, exit 0) is not undone by a new supervisor: it stays.

``conclude`` writes ``RUN_DIR/trained-with.json`` (atomically) and says the one line; the engine puts
the same list in the run's end record (``trained_with``), which notifications and the page read.
Nothing is written into the user's weights file.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..faults.remedies import Action
from ..record.fsutil import atomic_write_text
from ..record.journal import read_events

FILE_NAME = "trained-with.json"
AS_GIVEN = "trained with the recipe as given (no remedy)"
EVIDENCE_CHARS = 100  # of an evidence line in the one-line summary (the file keeps it whole)
# Remedy actions that restart with the same recipe: no change to tell.
_SAME_RECIPE = frozenset({Action("restart").describe(), Action("wait_foreign").describe()})
_ENDS = {"finish": "finished", "give_up": "gave_up"}  # a decision's kind -> the run's end; else stopped


@dataclass
class _Change:
    change: str
    why: dict[str, Any]
    environment: bool = False  # the trainer's environment (an upgrade): a new supervisor keeps it
    attempt: int | None = None  # the first attempt trained with it
    from_step: int | None = None
    until_step: int | None = None
    ended: bool = False  # a new supervisor stopped applying it

    def as_record(self) -> dict[str, Any]:
        return {"change": self.change, "why": self.why, "attempt": self.attempt, "from_step": self.from_step,
                "until_step": self.until_step, "environment": self.environment}


@dataclass
class _Fold:
    pending: list[_Change] = field(default_factory=list)  # earned, not launched yet
    applied: list[_Change] = field(default_factory=list)  # launched at least once (ended or not)
    fault: Mapping[str, Any] | None = None  # the last fault not answered by a remedy yet
    upgraded: list[str] = field(default_factory=list)  # "upgraded SPEC" since the last remedy: its own change
    restarted: bool = False  # a new supervisor began; its first attempt is where the old changes end
    seen_start: bool = False

    def run_start(self) -> None:
        if self.seen_start:
            self.pending = [c for c in self.pending if c.environment]  # never launched; an upgrade stays
            self.restarted = True
        self.seen_start = True

    def finished(self) -> None:
        """A finished run: whatever this run dir trains next is a new run; only its environment stays."""
        kept = [c for c in self.applied if c.environment and not c.ended]
        self.pending = [_Change(c.change, c.why, True) for c in kept] + [c for c in self.pending if c.environment]
        self.applied = []
        self.restarted = False

    def upgrade(self, record: Mapping[str, Any]) -> None:
        if record.get("exit_code") == 0 and record.get("spec"):
            change = f"upgraded {record['spec']}"
            self.upgraded.append(change)
            self.pending.append(_Change(change, self._why(), environment=True))

    def remedy(self, record: Mapping[str, Any]) -> None:
        for action in record.get("actions") or []:
            text = str(action)
            if text in _SAME_RECIPE or text in self.upgraded:
                continue  # the same recipe, or an upgrade already taken from its own record
            self.pending.append(_Change(text, self._why(record.get("class"))))
        self.fault, self.upgraded = None, []

    def _why(self, cls: Any = None) -> dict[str, Any]:
        fault = self.fault or {}
        return {"class": cls or fault.get("class"), "evidence": fault.get("evidence"),
                "attempt": fault.get("attempt")}

    def attempt_start(self, record: Mapping[str, Any]) -> None:
        step = record.get("resume_step")
        step = step if isinstance(step, int) and not isinstance(step, bool) else 0
        for change in self.applied:
            if change.ended or (self.restarted and not change.environment):
                change.ended = True  # the user's plan again from this attempt on
                change.until_step = step if change.until_step is None else min(change.until_step, step)
            elif change.from_step is not None:
                change.from_step = min(change.from_step, step)  # a resume from an earlier state
        self.restarted = False
        for change in self.pending:
            change.attempt, change.from_step = record.get("attempt"), step
        self.applied += self.pending
        self.pending = []

    def changes(self) -> list[dict[str, Any]]:
        kept = [c for c in self.applied if c.until_step is None or c.from_step is None or c.until_step > c.from_step]
        return [c.as_record() for c in kept]


def changes(events: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The changes to the user's recipe that shaped the run's weights, oldest first: ``change``,
    ``why`` (``class``, ``evidence``, ``attempt`` of the fault), ``attempt`` (the first trained with
    it), ``from_step``, ``until_step`` (None: to the end) and ``environment``. Empty: as given."""
    fold = _Fold()
    for record in events:
        kind = record.get("event")
        if kind == "run_start":
            fold.run_start()
        elif kind == "finished":
            fold.finished()
        elif kind == "fault":
            fold.fault = record
        elif kind == "environment_upgrade":
            fold.upgrade(record)
        elif kind == "remedy":
            fold.remedy(record)
        elif kind == "attempt_start":
            fold.attempt_start(record)
    return fold.changes()


def summary(changes: Sequence[Mapping[str, Any]]) -> str:
    """The one line for people: ``trained with: set PYTORCH_CUDA_ALLOC_CONF=... from step 8 (cuda_oom:
    torch.OutOfMemoryError: ...)``; an evidence line told once, its class alone after that."""
    if not changes:
        return AS_GIVEN
    parts, told = [], set()
    for c in changes:
        given = c.get("why")
        why: Mapping[str, Any] = given if isinstance(given, Mapping) else {}
        cls, evidence = why.get("class") or "unknown fault", why.get("evidence")
        reason = str(cls)
        if evidence and (cls, evidence) not in told:
            told.add((cls, evidence))
            reason += f": {_clip(str(evidence))}"
        span = f"from step {c.get('from_step')}" if c.get("from_step") is not None else "from its first attempt"
        if c.get("until_step") is not None:
            span += f" until step {c['until_step']} (a new supervisor started from your recipe)"
        parts.append(f"{c.get('change')} {span} ({reason})")
    return "trained with: " + "; ".join(parts)


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= EVIDENCE_CHARS else text[: EVIDENCE_CHARS - 1] + "…"


def conclude(run_dir: Path, decision_kind: str, say: Callable[[str], None],
             clock: Callable[[], float] = time.time) -> list[dict[str, Any]]:
    """At the run's end (finished, gave up, stopped): the changes from the journal, written to
    ``trained-with.json`` and said in one line. A file that cannot be written is said, never fatal:
    the end record carries the same list."""
    found = changes(read_events(run_dir))
    line = summary(found)
    record = {"end": _ENDS.get(decision_kind, "stopped"), "ts": round(clock(), 3), "summary": line,
              "changes": found}
    try:
        atomic_write_text(run_dir / FILE_NAME, _json(record))
    except OSError as exc:
        say(f"warning: cannot write {run_dir / FILE_NAME}: {exc.strerror or exc}; the journal's end record has it")
    say(line)
    return found


def load(run_dir: Path) -> dict[str, Any] | None:
    """``trained-with.json`` as written, or None when absent or unreadable."""
    try:
        data = json.loads((run_dir / FILE_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("changes"), list) else None


def _json(record: Mapping[str, Any]) -> str:
    return json.dumps(record, indent=2, ensure_ascii=False, default=str) + "\n"


__all__ = ["AS_GIVEN", "FILE_NAME", "changes", "conclude", "load", "summary"]
