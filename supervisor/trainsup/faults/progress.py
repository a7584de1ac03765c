"""Owns the trainer-neutral shape of training progress, and how faults/ is told a trainer's progress
lines: a ``ProgressFormat`` (any adapter's ``OutputFormat`` is one) that the scanner asks whether a
line shows training going on, so evidence that training outlived is dropped for every trainer.

``AnyProgress`` reads a log whose trainer is not known (``diagnose``): the first of several formats
whose hint the line holds and that parses it. It notes which formats recognised a line of the log
(``recognised``: their progress, a plain redraw or their success line), so ``diagnose`` can tell
whose output the log is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = ["AnyProgress", "Progress", "ProgressFormat"]


@dataclass(frozen=True)
class Progress:
    step: int
    total: int
    rate: float | None  # iterations per second
    loss: float | None


class ProgressFormat(Protocol):
    """A trainer's progress lines: ``progress_hint`` is a cheap substring every progress line holds
    (None: the trainer prints none), ``progress`` parses one, ``is_plain_redraw`` says a line is a
    progress redraw and nothing else (it carries no fault evidence), ``is_success`` that a line is the
    trainer's success marker (a saved log's: the line as written, cleaned or not)."""

    @property
    def progress_hint(self) -> str | None: ...

    def progress(self, line: str) -> Progress | None: ...

    def is_plain_redraw(self, line: str) -> bool: ...

    def is_success(self, line: str) -> bool: ...


class AnyProgress:
    """Several trainers' formats at once; ``progress_hint`` None: ``hints`` gate instead."""

    progress_hint: str | None = None

    def __init__(self, formats: Sequence[ProgressFormat]) -> None:
        self.formats = tuple(f for f in formats if f.progress_hint)
        self.hints = tuple(dict.fromkeys(f.progress_hint for f in self.formats if f.progress_hint))
        self.recognised: set[str] = set()  # format_name of each format that recognised a line

    def progress(self, line: str) -> Progress | None:
        for f in self.formats:
            if f.progress_hint and f.progress_hint in line and (found := f.progress(line)) is not None:
                self.recognised.add(format_name(f))
                return found
        return None

    def is_plain_redraw(self, line: str) -> bool:
        for f in self.formats:
            if f.progress_hint and f.progress_hint in line and f.is_plain_redraw(line):
                self.recognised.add(format_name(f))
                return True
        return False

    def is_success(self, line: str) -> bool:
        for f in self.formats:
            if f.is_success(line):
                self.recognised.add(format_name(f))
                return True
        return False


def format_name(fmt: object) -> str:
    """A format's name across processes (its class, module-qualified): the parallel log reader
    recognises lines in a process of its own."""
    cls = type(fmt)
    return f"{cls.__module__}.{cls.__qualname__}"


def hints_of(fmt: ProgressFormat | None) -> tuple[str, ...]:
    """The substrings that gate ``fmt``'s progress lines (none: no line is progress)."""
    if fmt is None:
        return ()
    if isinstance(fmt, AnyProgress):
        return fmt.hints
    return (fmt.progress_hint,) if fmt.progress_hint else ()
