"""Owns the evidence record and which of the evidence seen ended the run (the scanner's verdict).

``Held`` keeps one candidate per kind, in this order of preference (the scanner's module doc says
why): ``anchored`` (a traceback's exception line, the first), ``framed`` (a traceback judged by its
frames, the first), ``live`` (NaN loss), ``last`` (any other evidence, the newest).  Each
remembers the training bar that was newest when it was seen: evidence that the bar moved past did
not end the run and is dropped (live evidence stays).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from .matchers import parse_progress

__all__ = ["Evidence", "Held"]

_PREFERENCE = ("anchored", "framed", "live", "last")


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
        if self._held:
            self.drop_outlived()

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


def _bar_step(bar: str | None) -> int:
    """The step a training bar shows; 0 before the first bar (tqdm may draw its 0/N bar only
    when it is closed, after the traceback) and for a bar that does not parse."""
    progress = parse_progress(bar) if bar is not None else None
    return 0 if progress is None else progress.step
