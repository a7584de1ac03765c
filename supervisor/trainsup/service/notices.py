"""Owns what a notification says: the notices a run's journal calls for, worded, and the rate limit.

``RunStory`` folds the journal (records and status snapshots) of one run and returns a ``Notice``
when something happened that the policy's ``notify.on`` asks to be told. A fault is told once it is
answered: the ``remedy`` that follows it (``mylora: cuda_oom at step 812/2000 — restarting with
--a-memory-flag``, in the adapter's words), the ``gave_up`` that ends the run, or, failing both, the next launch.
A notice's first line (its title) says what happened; its body gives the evidence line, the remedy,
step, loss, speed and ETA; the sender appends the last lines of the attempt's log (``log_tail``).
The end's notice (finished, gave up, stopped) says what the weights were trained with: every change
trainsup made to the recipe, from which step and why (``run.trainedwith``, the end record's field).

Pure but for ``log_tail``, which reads the log: the sender thread calls it, never the journal's.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..faults.linetext import strip_ansi
from ..record.journalkinds import (
    ATTEMPT_END,
    ATTEMPT_START,
    FAULT,
    FINISHED,
    GAVE_UP,
    HANG_STACKS,
    REMEDY,
    RUN_START,
)
from ..record.textfmt import eta_seconds, format_duration, progress_parts
from ..run import trainedwith

EVIDENCE_CHARS = 500
TAIL_LINE_CHARS = 400
TAIL_READ_BYTES = 256 * 1024
_NUMBERS = re.compile(r"\d+(?:\.\d+)?")


@dataclass(frozen=True)
class Notice:
    kind: str  # the notify.on entry that asked for it: finished | gave_up | fault | remedy | hang | queue_empty
    title: str  # one line: what happened
    body: str  # the evidence, the remedy, step and ETA (the log tail is added when it is sent)
    level: str = "info"  # info | success | warning | failure (apprise's notification types)
    log: Path | None = None  # the attempt's log whose tail goes with it
    key: str | None = None  # notices with the same key are the same fault told again: rate-limited


class RateLimit:
    """Lets a key through once per ``window_s``; counts what it held back, told with the next one."""

    def __init__(self, window_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self._clock = clock
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def admit(self, key: str) -> int | None:
        """``None``: hold it back; else how many of this key were held back since the last one told."""
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self.window_s:
            self._held[key] = self._held.get(key, 0) + 1
            return None
        self._last[key] = now
        return self._held.pop(key, 0)


def fault_key(cls: str, evidence: str | None, actions: Collection[str]) -> str:
    """The same class, the same evidence but for its numbers, the same remedy: the same fault."""
    return "|".join((cls, _NUMBERS.sub("#", evidence or ""), *actions))


def remedy_phrase(actions: list[str]) -> str:
    """``restarting with PYTORCH_CUDA_ALLOC_CONF=...`` from the remedy's actions."""
    if not actions or actions == ["restart from the last safe state"]:
        return "restarting from the last saved state"
    if all(a.startswith(("add ", "set ")) for a in actions):
        return "restarting with " + ", ".join(a[4:] for a in actions)
    return "restarting: " + "; ".join(actions)


class RunStory:
    """One run's journal, folded into the notices ``on`` asks for."""

    def __init__(self, on: Collection[str], project: str | None = None) -> None:
        self.on = frozenset(on)
        self.given_project = project  # else the run_start's, else the run dir's name
        self._reset()

    def _reset(self) -> None:
        self.project = self.given_project
        self.run_dir: Path | None = None
        self.status: Mapping[str, Any] = {}
        self.started_at: float | None = None
        self.attempt: int | None = None
        self.attempts = 0
        self.faults: dict[str, int] = {}
        self.end_step: int | None = None  # the absolute step the last attempt ended at
        self.stacks: str | None = None  # the last hang's stack report
        self.pending: dict[str, Any] | None = None  # a fault not answered yet

    # --- folding ---------------------------------------------------------------------------------
    def on_status(self, snapshot: Mapping[str, Any]) -> None:
        self.status = snapshot

    def on_event(self, record: Mapping[str, Any]) -> list[Notice]:
        kind = record.get("event")
        if kind == RUN_START:
            self._reset()  # a new supervisor of this run dir
            self.project = self.project or record.get("project")
            self.run_dir = Path(record["run_dir"]) if record.get("run_dir") else None
            self.started_at = record.get("ts")
            return []
        out: list[Notice] = []
        if kind == ATTEMPT_START:
            out = self.flush()  # a fault nothing answered: told before the next launch
            self.attempt, self.attempts = record.get("attempt"), self.attempts + 1
        elif kind == ATTEMPT_END and not record.get("supervisor_lost"):
            self.end_step = record.get("step")
        elif kind == HANG_STACKS:
            self.stacks = record.get("path")
        elif kind == FAULT:
            out = self.flush()
            self.pending = dict(record)
            cls = str(record.get("class"))
            self.faults[cls] = self.faults.get(cls, 0) + 1
        elif kind == REMEDY:
            out = self._answered(record)
        elif kind == GAVE_UP:
            out = self._gave_up(record)
        elif kind == FINISHED:
            out = [*self.flush(), *self._finished(record)]
        return out

    def flush(self) -> list[Notice]:
        """A fault still waiting for its answer, told as it is (at the next launch, or at the end)."""
        fault, self.pending = self.pending, None
        if fault is None:
            return []
        cls = str(fault.get("class"))
        return self._notice(self._kinds(cls, "fault"), f"{self._at(cls)}", "warning",
                            self._fault_lines(fault), fault.get("attempt"),
                            fault_key(cls, fault.get("evidence"), ()))

    # --- the notices -----------------------------------------------------------------------------
    def _answered(self, remedy: Mapping[str, Any]) -> list[Notice]:
        fault, self.pending = self.pending or {}, None
        cls = str(remedy.get("class") or fault.get("class"))
        actions = [str(a) for a in remedy.get("actions") or []]
        delay = remedy.get("delay_s")
        lines = self._fault_lines(fault)
        lines.append(f"remedy (rung {remedy.get('rung')}): {'; '.join(actions) or 'restart'}"
                     + (f", relaunch in {delay:g} s" if isinstance(delay, (int, float)) else ""))
        return self._notice(self._kinds(cls, "fault", "remedy"), f"{self._at(cls)} — {remedy_phrase(actions)}",
                            "warning", lines, fault.get("attempt") or self.attempt,
                            fault_key(cls, fault.get("evidence"), actions))

    def _gave_up(self, end: Mapping[str, Any]) -> list[Notice]:
        code, reason = end.get("exit_code"), str(end.get("reason") or "")
        if isinstance(code, int) and code > 128:
            return self.flush()  # stopped by a signal: someone (you, systemd) asked for it; not told
        fault, self.pending = self.pending, None
        verb = "gave up" if code == 3 else "stopped"
        lines = self._fault_lines(fault) if fault else []
        lines.append(f"reason: {reason}" + (f" (exit {code})" if code is not None else ""))
        lines += _trained_with(end)
        kinds = ("gave_up",) + (self._kinds(str(fault.get("class")), "fault") if fault else ())
        return self._notice(kinds, f"{self._at(None, verb)} — {_first_line(reason)}", "failure", lines,
                            end.get("attempt") or self.attempt, None)

    def _finished(self, end: Mapping[str, Any]) -> list[Notice]:
        lines = [f"final weights: {end.get('final_weights')}"] if end.get("final_weights") else []
        took = (float(end["ts"]) - self.started_at) if self.started_at is not None and "ts" in end else None
        faults = ", ".join(f"{c} x{n}" for c, n in self.faults.items()) or "none"
        lines.append(f"attempts: {self.attempts}; faults: {faults}"
                     + (f"; took {format_duration(took)}" if took is not None else ""))
        lines += _trained_with(end)
        return self._notice(("finished",), self._at(None, "finished"), "success", lines,
                            end.get("attempt") or self.attempt, None, speed=False)

    def _notice(self, kinds: tuple[str, ...], title: str, level: str, lines: list[str], attempt: Any,
                key: str | None, speed: bool = True) -> list[Notice]:
        wanted = [k for k in kinds if k in self.on]
        if not wanted:
            return []
        lines = [*lines, self._progress_line(speed)]
        if self.run_dir is not None:
            lines.append(f"run dir: {self.run_dir}")
        log = self.run_dir / f"attempt-{attempt}.log" if self.run_dir is not None and attempt else None
        return [Notice(wanted[0], f"{self.name()}: {title}", "\n".join(lines), level, log, key)]

    def _kinds(self, cls: str, *kinds: str) -> tuple[str, ...]:
        return ("hang", *kinds) if cls == "hang" else kinds

    def _fault_lines(self, fault: Mapping[str, Any] | None) -> list[str]:
        if not fault:
            return []
        evidence = _clip(str(fault.get("evidence") or "(none)"), EVIDENCE_CHARS)
        where = f" (attempt-{fault.get('attempt')}.log line {fault['line']})" if fault.get("line") else ""
        lines = [f"evidence: {evidence}{where}"]
        if fault.get("class") == "hang" and self.stacks:
            lines.append(f"stacks: {self.stacks}")
        return lines

    def _at(self, cls: str | None, verb: str | None = None) -> str:
        step, total = self._step(), self.status.get("total")
        where = "" if step is None else f" at step {step}/{total}" if total else f" at step {step}"
        return f"{cls or verb}{where}"

    def _step(self) -> Any:
        step = self.status.get("step")
        return self.end_step if step is None else step

    def _progress_line(self, speed: bool) -> str:
        """Step, loss, speed and ETA (the speed last seen: a fault's ETA is at the speed it had)."""
        s = self.status
        step, total, loss, rate = self._step(), s.get("total"), s.get("loss"), s.get("rate") if speed else None
        parts = progress_parts(step, total, loss, rate, eta_s=eta_seconds(step, total, rate))
        if self.attempt is not None:
            parts.append(f"attempt {self.attempt}")
        return " · ".join(parts) or "no step yet"

    def name(self) -> str:
        if self.project:
            return self.project
        if self.run_dir is not None:
            return self.run_dir.parent.name if self.run_dir.name == ".trainsup" else self.run_dir.name
        return "trainsup"


def _trained_with(end: Mapping[str, Any]) -> list[str]:
    """The end record's ``trained_with`` in one line (none from a trainsup that did not record it)."""
    changes = end.get("trained_with")
    if not isinstance(changes, list):
        return []
    return [trainedwith.summary([c for c in changes if isinstance(c, Mapping)])]


def _first_line(text: str) -> str:
    return _clip(text.strip().splitlines()[0] if text.strip() else "", 200)


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split()) if "\n" in text else text
    return text if len(text) <= limit else text[: limit - 1] + "…"


def log_tail(path: Path, lines: int) -> list[str]:
    """The log's last ``lines`` lines as a terminal shows them (a ``\\r`` redraw keeps its last
    state, colours dropped, long lines cut); ``[]`` when it cannot be read."""
    if lines <= 0:
        return []
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(max(0, size - TAIL_READ_BYTES))
            data = fh.read()
    except OSError:
        return []
    text = data.decode("utf-8", "replace")
    if len(data) == TAIL_READ_BYTES and size > TAIL_READ_BYTES:
        text = text.partition("\n")[2]  # the first line read is cut
    shown = []
    for raw in text.split("\n"):
        redraws = [part for part in raw.split("\r") if part.strip()]
        shown.append(_clip(strip_ansi(redraws[-1] if redraws else "").rstrip(), TAIL_LINE_CHARS))
    while shown and not shown[-1]:
        shown.pop()
    return shown[-lines:]
