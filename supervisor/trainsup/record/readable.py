"""Owns how a trainer's output reads to a person: the console trainsup echoes it to, and the page's
log pane. The attempt log keeps every byte; only what is shown is changed.

trainsup starts the trainer with ``COLUMNS=250`` so that its lines are parsed whole, and a trainer
that lays its lines out for that width (rich's log records, tqdm's bar) reads badly in a 100-column
terminal: each record wraps over three rows, its ``file.py:123`` alone at the far right; each redraw
of a 250-cell bar wraps, so ``\\r`` no longer draws it in place. Shown to a person:

- a line ending in a rich-style source column (a run of 3 or more spaces, then ``name.py:123``) has
  that run collapsed to two spaces; trailing blanks (rich pads continuation rows too) are dropped;
- a bar (``NN%|████    |``) in a line wider than the display has its bar shortened, in proportion,
  until the line fits (10 cells at least);
- nothing else: words, ANSI colours and line ends are passed as they came.

``Readable`` does it to a stream of chunks (a pipe's reads), holding back only a partial line's
trailing blanks (and a word after them that may yet be ``name.py:123``) until the next chunk says
whether they pad a source column; ``readable_line`` does it to one line.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Callable

__all__ = ["DEFAULT_WIDTH", "Readable", "readable_line", "shorten_bar"]

DEFAULT_WIDTH = 100  # what the page's log pane and a console that is no terminal are read in
MIN_BAR = 10
# A line longer than this was laid out for no console (a dump, a flood): shown as it came, so that the
# echo stays linear in what the trainer writes (the pump reads the pipe only as fast as it echoes).
LONGEST_LAID_OUT = 4096
_SOURCE_COLUMN = re.compile(r"(?P<head>.*?\S)?(?P<pad> {3,})(?P<source>[\w.\-<>]+\.py:\d+)[ \t]*\Z")
_MAYBE_SOURCE = re.compile(r" {3,}[\w.\-<>:]*[ \t]*\Z")
_BAR = re.compile(r"(?P<pct>\d+%)\|(?P<bar>[ #0-9▏▎▍▌▋▊▉█]{11,})\|")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def shorten_bar(segment: str, width: int) -> str:
    """``segment`` with its progress bar shortened so that the whole fits ``width`` cells."""
    found = _BAR.search(segment)
    over = len(_ANSI.sub("", segment)) - width
    if found is None or over <= 0:
        return segment
    bar = found.group("bar")
    cells = max(MIN_BAR, len(bar) - over)
    if cells >= len(bar):
        return segment
    filled = sum(1 for ch in bar if ch != " ")
    full = min(cells, round(filled * cells / len(bar)))
    new = "█" * full + " " * (cells - full)
    return segment[:found.start("bar")] + new + segment[found.end("bar"):]


def readable_line(line: str, width: int = DEFAULT_WIDTH, *, continued: bool = False) -> str:
    """One line (no line end) as shown: the source column's padding collapsed, trailing blanks
    dropped, a too-wide bar shortened. ``continued``: the start of this line was shown already."""
    found = _SOURCE_COLUMN.match(line) if len(line) <= LONGEST_LAID_OUT else None
    if found is not None and (found.group("head") is not None or continued):
        line = (found.group("head") or "") + "  " + found.group("source")
    return shorten_bar(line.rstrip(" \t"), width)


class Readable:
    """A stream's chunks as shown (``feed`` per chunk, ``flush`` at its end); not thread-safe: one
    per stream."""

    def __init__(self, width: Callable[[], int] = lambda: DEFAULT_WIDTH) -> None:
        self.width = width
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="surrogateescape")
        self._held = ""  # a partial line's trailing blanks, not shown yet
        self._continued = False  # part of the current line was shown already

    def feed(self, chunk: bytes) -> bytes:
        text = self._held + self._decoder.decode(chunk)
        self._held = ""
        width = self.width()
        out: list[str] = []
        start = 0
        for found in re.finditer(r"[\r\n]", text):
            segment, end = text[start:found.start()], found.group()
            if end == "\n":
                out.append(readable_line(segment, width, continued=self._continued) + "\n")
            else:  # a line redrawn in place (a bar): its padding wipes a longer text before it, so it stays
                out.append(shorten_bar(segment, width) + "\r")
            self._continued = False
            start = found.end()
        tail = text[start:]
        if tail:
            from_at = max(0, len(tail) - LONGEST_LAID_OUT)
            column = _MAYBE_SOURCE.search(tail, from_at)  # padding, and what may yet become ``name.py:123``
            shown = tail[:column.start()] if column is not None else tail.rstrip(" \t")
            self._held = tail[len(shown):]
            if shown:
                out.append(shorten_bar(shown, width))
                self._continued = True
        return "".join(out).encode("utf-8", errors="surrogateescape")

    def flush(self) -> bytes:
        """What is still held (a stream that ended inside a line)."""
        rest, self._held = self._held + self._decoder.decode(b"", final=True), ""
        return rest.encode("utf-8", errors="surrogateescape")
