"""Owns the supervisor's console: the trainer's output echoed for a person, and trainsup's own lines,
which never run onto the trainer's.

The pumps (``run.pump``) echo each chunk the trainer writes through ``echo`` (made readable in the
console's width by ``record.readable``; the attempt log gets the raw bytes before this); trainsup's
lines go through ``say``. When the last thing the trainer wrote to the same place (the terminal both
stdout and stderr usually are) did not end its line (a ``\\r`` progress bar, a prompt), ``say`` ends
it first, so that ``trainsup: ...`` starts a line of its own; the bar's next redraw starts on the line
after it. A write never waits on anything but the console itself: the pumps keep draining the pipes.

``CONSOLE`` is the process's one console (file descriptors 1 and 2).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable

from ..record.readable import DEFAULT_WIDTH, Readable

__all__ = ["CONSOLE", "Console"]


def _where(fd: int) -> tuple[int, int] | int:
    """What ``fd`` writes to (two descriptors on one terminal or file are one place)."""
    try:
        st = os.fstat(fd)
    except OSError:
        return fd
    return (st.st_dev, st.st_ino)


def _width(fd: int) -> int:
    try:
        return os.get_terminal_size(fd).columns if os.isatty(fd) else DEFAULT_WIDTH
    except OSError:
        return DEFAULT_WIDTH


class Console:
    def __init__(self, write: Callable[[int, bytes], int] = os.write,
                 err: Callable[[], object] = lambda: sys.stderr) -> None:
        self._write = write  # os.write's shape: a seam for tests
        self._err = err  # where ``say`` prints (sys.stderr as it is at the time: pytest replaces it)
        self._lock = threading.Lock()
        self._open: dict[tuple[int, int] | int, bool] = {}  # a place whose last line is not ended
        self._readable: dict[int, Readable] = {}

    def echo(self, fd: int, chunk: bytes) -> None:
        """Show a chunk of the trainer's output on ``fd``; raises ``OSError`` when it cannot."""
        with self._lock:
            readable = self._readable.get(fd)
            if readable is None:
                readable = self._readable[fd] = Readable(lambda: _width(fd))
            shown = readable.feed(chunk)
            self._put(fd, shown)

    def end(self, fd: int) -> None:
        """The stream echoed on ``fd`` ended (its pipe closed): what it held back is shown, and the
        next attempt's output starts afresh."""
        with self._lock:
            readable = self._readable.pop(fd, None)
            if readable is not None:
                self._put(fd, readable.flush())

    def _put(self, fd: int, data: bytes) -> None:
        if not data:
            return
        rest = data
        while rest:
            rest = rest[self._write(fd, rest):]
        self._open[_where(fd)] = not data.endswith(b"\n")

    def say(self, line: str) -> None:
        """One line of trainsup's own on stderr, on a line of its own."""
        err = self._err()
        with self._lock:
            fd = _fileno(err)
            where = _where(fd) if fd is not None else None
            ended = "\n" if where is not None and self._open.get(where) else ""
            print(ended + line, file=err, flush=True)  # type: ignore[call-overload]
            if where is not None:
                self._open[where] = False


def _fileno(stream: object) -> int | None:
    try:
        fileno = getattr(stream, "fileno", None)
        return int(fileno()) if callable(fileno) else None
    except (OSError, ValueError):
        return None  # a stream with no descriptor (a test's StringIO)


CONSOLE = Console()
