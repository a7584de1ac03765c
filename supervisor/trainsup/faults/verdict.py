"""Owns the evidence record and which of the evidence seen ended the run (the scanner's verdict).

``Held`` keeps one candidate per kind and answers, in this order:

1. ``live``: a NaN loss, the first.  The trainer does not stop by itself, and whatever crashes after
   a NaN (a device-side assert, a NaN check raising) is its consequence: the first cause wins.
2. ``cause`` and ``anchored``, whichever came first: a first cause (an out-of-memory message, in a
   traceback or not: the crashes of other ranks follow from it) and a traceback's exception line
   that a rule names.  The first, so launcher noise and chained exceptions never override the root.
3. ``framed``: a traceback judged by its frames (a cut traceback), the first.
4. the end of the log: the newer of ``last`` (any other evidence, the newest) and ``ending`` (an
   exception line no rule names, ``unknown``, the first of its failure): a warning printed before
   the exception the log ends with does not explain it, a line the traceback itself holds does (an
   ``ending`` remembers where its traceback began); without an ending, ``tail`` (a wait the log ends
   at, e.g. at a process-group barrier; the scanner withdraws it as soon as any line follows) before
   ``last``.

Whichever that is, a collective's failure (``FaultRule.consequence``: a timeout, a lost peer) gives way to an
exception line no rule names, or a traceback judged by its frames, seen before it: the rank that failed first
(the others only waited for it, printing their timeouts minutes later, in any order in interleaved output);
else to a launcher's report that a rank was killed by SIGKILL, wherever it stands (a rank killed outright
prints nothing; torchrun reports it in its failure table, after the others' tracebacks).

Each candidate remembers the progress seen when it was recorded; progress after it means it did
not end the run and drops it (``live`` stays):
- the trainer's own progress (its adapter's progress parser, whatever the trainer
  prints: a tqdm bar, a metrics line per iteration, ...): ``last`` evidence is dropped when the step moves past where
  it stood; every other kind when it rose twice after it (the first bar after a traceback may be
  tqdm's closing redraw, one step on: a crash pasted with one more bar line is still a crash);
- any other tqdm bar (a sampler's, a GUI's, another trainer's): when it rose twice after the
  evidence (``last`` also when it rose to its end);
- metric lines that name a finite loss (``{'loss': 1.2, ...}``, ``Step 5 | loss:0.9``): two of
  them after the evidence.
Only ``last``, ``ending`` and ``tail`` evidence is outlived by those two: a rank that died while
another rank's bars and metrics went on (before it blocked in the next collective, or while it
sampled) still ended the run.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from .progress import Progress

__all__ = ["NOTHING_SAID", "Evidence", "Held", "Said"]

# Any tqdm bar: "desc: 35%|███     | 7/20 [00:21<00:38, ...": its desc, step and total (the last one on a line).
_TQDM = re.compile(r"([^\]|%]{0,40}?)\s*\d+%\|[^|]*\|\s*(\d+)/(\d+)")
_METRICS = ("(metrics)", 0)  # the identity metric lines count under, as if they were a bar
_FIRSTS = ("cause", "anchored")
# A traceback's exception line, a first cause, a traceback judged by its frames and a NaN loss are
# outlived by the trainer's own progress only: another rank may still draw its bars after a rank died.
_OUTLIVED_BY_ANY_BAR = frozenset({"last", "ending", "tail"})


@dataclass(frozen=True)
class Said:
    """What a remedy reads of a fault's evidence: its ``line`` (None: there was none) and the named
    groups of the rule pattern that recognised it (``Evidence.groups``).

    A remedy that needs a number or a name from the evidence reads its group; it parses ``line`` only
    when the group is absent: a user rule without that group, or evidence read back as bare text (a
    journal's, a pasted log's), which ``Said(text)`` carries with no groups."""

    line: str | None = None
    groups: Mapping[str, str] = field(default_factory=dict)


NOTHING_SAID = Said()  # no evidence at all: a remedy judged on the command alone


@dataclass(frozen=True)
class Evidence:
    """A line that is evidence for a fault: ``line`` as the child wrote it (the rows
    joined by ``\\n`` when a wrapped message matched across them), ``lineno`` its first.
    ``groups``: the named groups of the rule pattern that matched it (``(?P<pkg>...)``), or what
    the sensor that made it knows (a hang's ``spot``), so that no consumer parses ``line`` again."""

    fault: str
    line: str
    lineno: int
    strength: str
    anchored: bool = False  # the exception line of a traceback (frames in sight)
    live: bool = False  # the rule asks for action while the child runs (NaN loss)
    framed: bool = False  # a traceback judged by its frames (see ``frames``)
    explanation: str = field(default="", compare=False)  # the matching rule's
    cause: bool = False  # a first cause (out of memory): it stands over the crashes it leads to
    kind: str = ""  # "ending": an exception line no rule names; "tail": a wait the log ends at
    since: int = field(default=0, compare=False)  # an ending's traceback began here (0: unknown)
    groups: Mapping[str, str] = field(default_factory=dict, compare=False)
    consequence: bool = False  # a collective's failure: an earlier failure of another rank explains it

    @property
    def said(self) -> Said:
        """The line and groups a remedy reads."""
        return Said(self.line, self.groups)


@dataclass
class _Slot:
    """A held candidate and the progress seen since it was recorded."""

    ev: Evidence
    base: int | None  # the trainer's step when it was recorded (None: no progress shown yet)
    bars: dict[tuple[str, int], tuple[int, int]]  # any bar's identity -> (highest step, rises) since
    first: int | None = None  # with no base: the first progress after it (maybe tqdm's closing redraw)
    ended: bool = False  # some other bar rose to its end from below


class Held:
    """The verdict's candidates; ``priority``: each fault's first place in the rule table;
    ``progress``: the trainer's progress parser (None: no line is the trainer's progress)."""

    def __init__(self, live_ids: frozenset[str], priority: Mapping[str, int],
                 progress: Callable[[str], Progress | None] | None = None) -> None:
        self._parse = progress
        self._live_ids = live_ids
        self._priority = priority
        self._held: dict[str, _Slot] = {}
        self.bar: str | None = None  # the newest line of the trainer's progress seen (parsed when needed)
        self._drawn: str | None = None  # the newest bar of any kind seen
        self._metrics = 0  # metric lines seen
        self._launcher_kill: Evidence | None = None  # the first SIGKILL of a rank its launcher reported

    @property
    def verdict(self) -> Evidence | None:
        found = self._verdict()
        if found is None or not found.consequence:
            return found
        # A collective that failed (timed out, lost its peer) after a rank had already failed: that rank's
        # failure is the first cause, the collective's only the others' wait for it, whatever its order.
        earlier = [slot.ev for kind, slot in self._held.items()
                   if kind in ("ending", "framed") and slot.ev.lineno < found.lineno and not slot.ev.consequence]
        if earlier:
            return min(earlier, key=lambda ev: ev.lineno)
        # A rank killed outright (the kernel's OOM killer) or crashed in native code (a segfault) prints
        # nothing of its own: its launcher's report, printed after the others' failed collectives, names the
        # cause. (A watchdog's own abort is a SIGABRT: a timeout that was the cause stays one.)
        return self._launcher_kill or found

    def note_launcher_kill(self, ev: Evidence) -> None:
        """A launcher reported that one of its processes was killed by SIGKILL or crashed (``ev``: that
        report): it stands over the collectives that failed for the lost peer (see ``verdict``)."""
        if self._launcher_kill is None:
            self._launcher_kill = ev

    def _verdict(self) -> Evidence | None:
        held = self._held
        if "live" in held:
            return held["live"].ev
        firsts = [held[k].ev for k in _FIRSTS if k in held]
        if firsts:
            return min(firsts, key=lambda ev: ev.lineno)
        if "framed" in held:
            return held["framed"].ev
        last, ending = held.get("last"), held.get("ending")
        if ending is not None:
            since = ending.ev.since or ending.ev.lineno
            return last.ev if last is not None and last.ev.lineno >= since else ending.ev
        if "tail" in held:
            return held["tail"].ev
        return last.ev if last is not None else None

    def note_bar(self, line: str) -> None:
        """A line of the trainer's progress, fed or not: evidence it outlived is dropped."""
        self.bar = line
        if "%|" in line:  # a tqdm bar is a bar like any other too
            self.draw(line)
        if not self._held:
            return
        step = self._step(line)
        for kind, slot in list(self._held.items()):
            if kind == "live":
                continue
            if kind == "last":
                gone = step > (slot.base or 0)
            elif slot.base is not None:
                gone = step >= slot.base + 2  # one step on may be the closing redraw
            elif slot.first is None:
                slot.first, gone = step, False  # where it stood: no bar was drawn before
            else:
                gone = step > slot.first
            if gone:
                del self._held[kind]

    def draw(self, line: str) -> None:
        """Any tqdm bar seen (the trainer's own too): drop evidence it outlived."""
        self._drawn = line
        if not self._held:
            return
        bar = _tqdm(line)
        if bar is None:
            return
        key, step = bar
        for kind, slot in list(self._held.items()):
            if kind not in _OUTLIVED_BY_ANY_BAR:
                continue
            high, rises = slot.bars.get(key, (step, -1))
            if rises < 0:
                slot.bars[key] = (step, 0)  # first drawn after the evidence: where it stood
                continue
            if step > high:
                rises += 1
                slot.ended = slot.ended or step == key[1] >= 2
                slot.bars[key] = (step, rises)
                if rises >= 2 or (kind == "last" and slot.ended):
                    del self._held[kind]

    def metric(self) -> None:
        """A metric line naming a finite loss: training went on (twice after evidence drops it)."""
        self._metrics += 1
        for kind, slot in list(self._held.items()):
            if kind not in _OUTLIVED_BY_ANY_BAR:
                continue
            start, _ = slot.bars.get(_METRICS, (self._metrics - 1, 0))
            if self._metrics - start >= 2:
                del self._held[kind]

    def withdraw_tail(self) -> None:
        """A line followed the wait the log seemed to end at: it did not end there."""
        self._held.pop("tail", None)

    def record(self, ev: Evidence) -> Evidence:
        """Hold ``ev`` where it belongs; returns it as held (marked live for a live fault)."""
        if ev.fault in self._live_ids:
            ev = replace(ev, live=True)
            kind = "live"
        elif ev.kind in ("tail", "ending"):
            kind = ev.kind
        elif ev.framed:
            kind = "framed"
        elif ev.strength == "root" and ev.cause:
            kind = "cause"
        else:
            kind = "anchored" if ev.anchored and ev.strength == "root" else "last"
        for other, slot in list(self._held.items()):
            # The same message read across more of its rows, naming a more specific fault.
            old = slot.ev
            if old.lineno == ev.lineno and self._priority.get(ev.fault, 0) < self._priority.get(old.fault, 0):
                del self._held[other]
        if kind not in self._held or kind in ("last", "tail"):
            self._held[kind] = _Slot(ev, self._step(self.bar) if self.bar is not None else None, self._bars_now())
        return ev

    def _step(self, line: str) -> int:
        """The step a progress line shows; 0 for one that does not parse (tqdm may draw its 0/N bar
        only when it is closed, after the traceback)."""
        progress = self._parse(line) if self._parse is not None else None
        return 0 if progress is None else progress.step

    def _bars_now(self) -> dict[tuple[str, int], tuple[int, int]]:
        """Where the newest bar of any kind stands: the baseline a slot's rises count from."""
        bar = _tqdm(self._drawn) if self._drawn is not None else None
        out = {bar[0]: (bar[1], 0)} if bar is not None else {}
        out[_METRICS] = (self._metrics, 0)
        return out


def _tqdm(line: str) -> tuple[tuple[str, int], int] | None:
    """A tqdm bar's identity (its desc and total) and step; None for a line that is not one."""
    last = None
    for last in _TQDM.finditer(line):
        pass
    if last is None:
        return None
    return (last.group(1).strip(), int(last.group(3))), int(last.group(2))
