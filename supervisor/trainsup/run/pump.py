"""Owns moving a child's output: pipe -> attempt log + console, and chunks on to the parser.

One reader thread per pipe takes large ``os.read`` chunks and writes them raw to the attempt log, then
to the console (made readable for a person there: ``run.console``) before anything else, so the child
never waits on trainsup's parsing. Parsing has a
per-chunk line budget: when the child floods (a big chunk means the pipe filled up while we worked),
only the newest lines of the chunk are parsed and the rest are counted as skipped. The log always
gets every byte.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import IO, Protocol

from .console import CONSOLE, Console

READ_SIZE = 1 << 20
COALESCE_BELOW = 64 * 1024
COALESCE_S = 0.005


class ChunkSink(Protocol):
    def feed(self, stream: str, chunk: bytes) -> None: ...

    def end(self, stream: str) -> None: ...


class AttemptLog:
    """The attempt's full output, both streams in arrival order, append-only."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.write_errors = 0

    def write(self, data: bytes) -> None:
        try:
            _write_all(self.fd, data)
        except OSError:
            # A full disk must not stall the child: the bytes still reach the console and parser.
            self.write_errors += 1

    def close(self) -> None:
        os.close(self.fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


class Pump(threading.Thread):
    def __init__(self, stream: str, pipe: IO[bytes], log: AttemptLog, console_fd: int | None,
                 sink: ChunkSink, console: Console = CONSOLE) -> None:
        super().__init__(name=f"pump-{stream}", daemon=True)
        self.console = console  # shows the chunk to a person (``run.console``): readable, never under trainsup's lines
        self.stream = stream
        self.fd = pipe.fileno()
        self.pipe = pipe
        self.log = log
        self.console_fd = console_fd
        self.sink = sink
        self.bytes = 0
        self.console_errors = 0

    def run(self) -> None:
        try:
            while True:
                try:
                    chunk = os.read(self.fd, READ_SIZE)
                except OSError:
                    break
                if not chunk:
                    break
                self.bytes += len(chunk)
                self.log.write(chunk)
                if self.console_fd is not None:
                    try:
                        self.console.echo(self.console_fd, chunk)
                    except OSError:
                        self.console_errors += 1  # a closed console must not stop supervision
                self.sink.feed(self.stream, chunk)
                if len(chunk) < COALESCE_BELOW:
                    # A trickle of small writes: let the roomy pipe gather a few ms of output so the
                    # per-chunk cost is paid once per batch, not once per line. The child cannot
                    # fill 1 MiB in that time at any realistic rate, so it never blocks on us.
                    time.sleep(COALESCE_S)
        finally:
            if self.console_fd is not None:
                try:
                    self.console.end(self.console_fd)
                except OSError:
                    self.console_errors += 1
            self.sink.end(self.stream)
            try:
                self.pipe.close()
            except OSError:
                pass
