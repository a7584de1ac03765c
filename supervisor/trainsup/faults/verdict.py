"""Owns the evidence record and which of the evidence seen ended the run (the scanner's verdict).

``Held`` keeps one candidate per kind, in this order of preference (the scanner's module doc says
why): ``anchored`` (a traceback's exception line, the first), ``framed`` (a traceback judged by its
frames, the first), ``live`` (NaN loss), ``last`` (any other evidence, the newest).  Each
remembers the training bar that was newest when it was seen: evidence that the bar moved past did
not end the run and is dropped (live evidence stays).

Any other tqdm bar (a sampler's, a GUI's) tells the same of ``last`` evidence only, and only when it
rose twice after it, or to its end from below: a rank that died while another rank's bar ticked once
more, before it blocked in the next collective, still ended the run; a traceback's exception line and
a traceback judged by its frames are never dropped by these bars, and a NaN loss never is.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from .matchers import parse_progress

__all__ = ["Evidence", "Held"]

_PREFERENCE = ("anchored", "framed", "live", "last")
# Any tqdm bar: "desc: 35%|███     | 7/20 [00:21<00:38, ...": its desc, step and total (the last one on a line).
_TQDM = re.compile(r"([^\]|%]{0,40}?)\s*\d+%\|[^|]*\|\s*(\d+)/(\d+)")


@dataclass(frozen=True)
class Evidence:
    """A line that is evidence for a fault: ``line`` as the child wrote it (the rows
    joined by ``\\n`` when a wrapped message matched across them), ``lineno`` its first."""

    fault: str
    line: str
    lineno: int
    strength: str
    anchored: bool = False  # the exception line of a traceback (frames in sight)
    live: bool = False  # the rule asks for action while the child runs (NaN loss)
    framed: bool = False  # a traceback judged by its frames (see ``frames``)
    explanation: str = field(default="", compare=False)  # the matching rule's


class Held:
    """The verdict's candidates; ``priority``: each fault's first place in the rule table."""

    def __init__(self, live_ids: frozenset[str], priority: Mapping[str, int]) -> None:
        self._live_ids = live_ids
        self._priority = priority
        self._held: dict[str, tuple[Evidence, str | None]] = {}
        self.bar: str | None = None  # the newest ``steps`` bar seen
        self._drawn: str | None = None  # the newest bar of any kind seen
        # Since the held ``last`` evidence: each bar's (desc, total) -> (highest step, times it rose).
        self._rises: dict[tuple[str, int], tuple[int, int]] | None = None

    @property
    def verdict(self) -> Evidence | None:
        self.drop_outlived()
        for kind in _PREFERENCE:
            held = self._held.get(kind)
            if held is not None:
                return held[0]
        return None

    def note_bar(self, line: str) -> None:
        self.bar = line
        self.draw(line)
        if self._held:
            self.drop_outlived()

    def draw(self, line: str) -> None:
        """Any tqdm bar seen (the trainer's ``steps`` bar too): drop ``last`` evidence it outlived."""
        self._drawn = line
        rises = self._rises
        if rises is None:
            return
        if "last" not in self._held:  # (the trainer's bar dropped it first)
            self._rises = None
            return
        bar = _tqdm(line)
        if bar is None:
            return
        key, step = bar
        seen = rises.get(key)
        if seen is None:
            rises[key] = (step, 0)  # first drawn after the evidence: where it stood
        elif step > seen[0]:
            if seen[1] >= 1 or step == key[1] >= 2:
                self._held.pop("last", None)  # it went on: that evidence did not end the run
                self._rises = None
            else:
                rises[key] = (step, 1)

    def record(self, ev: Evidence) -> Evidence:
        """Hold ``ev`` where it belongs; returns it as held (marked live for a live fault)."""
        if ev.fault in self._live_ids:
            ev = replace(ev, live=True)
            kind = "live"
        elif ev.framed:
            kind = "framed"
        else:
            kind = "anchored" if ev.anchored and ev.strength == "root" else "last"
        self.drop_outlived()
        for other, (old, _) in list(self._held.items()):
            # The same message read across more of its rows, naming a more specific fault.
            if old.lineno == ev.lineno and self._priority.get(ev.fault, 0) < self._priority.get(old.fault, 0):
                del self._held[other]
        held = self._held.get(kind)
        if held is None or kind == "last":
            self._held[kind] = (ev, self.bar)
        if kind == "last":
            bar = _tqdm(self._drawn) if self._drawn is not None else None
            self._rises = {} if bar is None else {bar[0]: (bar[1], 0)}
        return ev

    def drop_outlived(self) -> None:
        """Forget held evidence that training progress followed: it did not end the run."""
        bar = self.bar
        held = [(kind, h) for kind, h in self._held.items() if kind != "live" and h[1] is not bar]
        if bar is None or not held:
            return  # (a held NaN loss costs no parse of every redraw)
        now = _bar_step(bar)
        for kind, (ev, then) in held:
            if then is None and kind == "anchored":
                # The first bar after a traceback may be tqdm's redraw as it closes (a paste often
                # starts there): it is where the run stood; only a bar past it is progress.
                self._held[kind] = (ev, bar)
            elif now > _bar_step(then):
                del self._held[kind]


def _tqdm(line: str) -> tuple[tuple[str, int], int] | None:
    """A tqdm bar's identity (its desc and total) and step; None for a line that is not one."""
    last = None
    for last in _TQDM.finditer(line):
        pass
    if last is None:
        return None
    return (last.group(1).strip(), int(last.group(3))), int(last.group(2))


def _bar_step(bar: str | None) -> int:
    """The step a training bar shows; 0 before the first bar (tqdm may draw its 0/N bar only
    when it is closed, after the traceback) and for a bar that does not parse."""
    progress = parse_progress(bar) if bar is not None else None
    return 0 if progress is None else progress.step
