"""Owns reading a finished log file the way the fault scanner should see it, fast enough for many GB.

``trainsup diagnose`` feeds the live supervisor's ``FaultScanner`` (same rules, same scanner) with
the lines of a saved log.  The file is read in large binary chunks and never held whole; lines end
at ``\\n`` and are capped at ``splitter.DEFAULT_MAX_LINE`` like the live splitter's.

A line that holds ``\\r`` redraws (tqdm's bars) is read as a terminal shows it: its final redraw,
the text after the last ``\\r`` (a trailing ``\\r``, as in ``\\r\\n``, overwrites nothing).  Output
that ends a line, a traceback glued to a bar included, is therefore always read; what a later
redraw overwrote was a progress bar (logging, print and tracebacks end with ``\\n``).  This is
what makes multi-GB logs cheap: a training bar redrawn a million times costs one line.  A NaN
loss is not lost by it either: a trainer's running average stays NaN once it is.  A file whose first
MiB holds ``\\r`` but no ``\\n`` is taken for ``\\r``-terminated (old Mac style) and every
``\\r`` then ends a line.  As in the live supervisor, plain redraws of the trainer's progress (the
``ProgressFormat`` given: ``diagnose`` gives every known adapter's) are not scanned; the scanner
only hears of the first and the newest of a run of them before each line it reads, which is all it
needs to know that training went on after some evidence.  The format's success marker says the run
finished.

Line numbers are the ones editors, ``sed -n Np`` and ``grep -n`` give: ``\\n`` starts a line.
The whole log is read: evidence early in a log is dropped when training went on after it.

The log may also show the trainer's command line, which a diagnosis can then correct.  Many
training scripts do not echo their argv, but what launched them often does: GUIs and wrappers print
``Running command: ...`` / ``Executing command: ...``, shell transcripts hold the ``accelerate
launch ...`` or ``python ... train_network.py ...`` line itself, and accelerate's
``CalledProcessError`` names the child's argv as a Python list.  The first explicit line wins; the
launcher's list (which lacks ``accelerate launch``) is the fallback.  A candidate counts only when
it runs a training script (a ``*.py`` or ``-m`` module whose name holds ``train``).
"""

from __future__ import annotations

import ast
import contextlib
import itertools
import multiprocessing
import os
import re
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import BinaryIO

from .linetext import clean_line
from .progress import AnyProgress, ProgressFormat, hints_of
from .rules import BUILTIN_RULES, FaultRule
from .scanner import Evidence, FaultScanner
from .splitter import DEFAULT_MAX_LINE, LineSplitter

__all__ = ["CHUNK_SIZE", "PARALLEL_MIN", "CommandFinder", "LogScan", "command_from_line", "scan_file", "scan_log",
           "terminal_lines"]

CHUNK_SIZE = 1 << 20
_DETECT = 1 << 20  # a file whose first MiB has \r but no \n ends its lines with \r
PARALLEL_MIN = 64 << 20  # below this a second process costs more than it saves
_decode = LineSplitter._decode  # errors="replace": garbage bytes never stop a diagnosis


# --- the trainer's command line, when the log shows it -----------------------------------

_RUNNING = re.compile(
    r"\b(?:Running|Executing|Launching|Run|Exec)(?:\s+the)?(?:\s+training)?\s+command\s*[:=]?\s*(?P<cmd>\S.*)$",
    re.IGNORECASE)
_SHELL = re.compile(
    r"^(?:[$#>]\s+)?(?P<cmd>(?:\S*[/\\])?(?:accelerate(?:\.exe)?\s+launch"
    r"|python(?:\d+(?:\.\d+)?)?(?:\.exe)?)\s.*)$")
_CALLED = re.compile(r"Command '(?P<list>\[.*?\])' (?:returned non-zero|died with)")


def _argv(text: str) -> list[str] | None:
    """A command given as a shell line or as a Python list literal."""
    text = text.strip()
    try:
        if text.startswith("["):
            value = ast.literal_eval(text)
            return [str(v) for v in value] if isinstance(value, list) and value else None
        argv = shlex.split(text)
    except (ValueError, SyntaxError):
        return None
    return argv or None


def _is_trainer(argv: list[str]) -> bool:
    """Whether the command runs a training script: a ``*.py`` or ``-m`` module named ``*train*``."""
    scripts = [argv[i + 1] for i, t in enumerate(argv[:-1]) if t == "-m"]
    scripts += [t for t in argv if t.endswith(".py") and not t.startswith("-")]
    return any("train" in os.path.basename(t.replace("\\", "/")).lower() for t in scripts)


def command_from_line(text: str) -> tuple[int, list[str]] | None:
    """``(rank, argv)`` for a line showing a training command (rank 0 explicit, 1 launcher noise)."""
    line = clean_line(text)
    m = _CALLED.search(line)
    if m is not None:
        argv = _argv(m.group("list"))
        return (1, argv) if argv is not None and _is_trainer(argv) else None
    m = _RUNNING.search(line) or _SHELL.match(line)
    if m is None:
        return None
    argv = _argv(m.group("cmd"))
    return (0, argv) if argv is not None and _is_trainer(argv) else None


class CommandFinder:
    """Collects the best command line offered; ``gate`` keeps the cost off ordinary lines."""

    def __init__(self) -> None:
        self._best: tuple[int, list[str]] | None = None

    @property
    def wanted(self) -> bool:
        """Whether a line could still improve on what was found."""
        return self._best is None or self._best[0] > 0

    @staticmethod
    def gate(text: str) -> bool:
        return "ommand" in text or "launch" in text or "python" in text

    def offer(self, text: str) -> None:
        found = command_from_line(text)
        if found is not None and (self._best is None or found[0] < self._best[0]):
            self._best = found

    @property
    def command(self) -> list[str] | None:
        return None if self._best is None else self._best[1]


@dataclass(frozen=True)
class LogScan:
    """What one log says: the scanner's verdict and the signs around it."""

    verdict: Evidence | None
    lines: int  # lines read
    failed: bool  # the run visibly failed: root evidence after any success, the launcher said so,
    #               or a traceback ended it
    success: bool  # the trainer's success marker with no failure after it
    command: list[str] | None  # the trainer's command line, when the log shows it
    last_lines: tuple[tuple[str, int], ...] = ()  # the last lines that were not bars, (line, lineno)
    recognised: frozenset[str] = frozenset()  # the formats (``progress.format_name``) that read a line of it


def _chunks(fh: BinaryIO, chunk_size: int) -> Iterator[bytes]:
    while chunk := fh.read(chunk_size):
        yield chunk


def _batches(fh: BinaryIO, max_line: int, chunk_size: int) -> Iterator[list[bytes]]:
    """The file's lines, a chunk's worth at a time, without their ending (``\\r`` redraws kept)."""
    chunks = _chunks(fh, chunk_size)
    head = b""
    for chunk in chunks:  # a \n, or the first MiB without one, decides how lines end
        head += chunk
        if b"\n" in head or len(head) >= _DETECT:
            break
    sep = b"\r" if b"\n" not in head and b"\r" in head else b"\n"
    tail = b""
    for chunk in itertools.chain((head,), chunks):
        if not chunk:
            continue
        data = tail + chunk if tail else chunk
        pieces = data.split(sep)
        tail = _squeeze(pieces.pop(), max_line)
        yield pieces
    if tail:
        yield [tail]


def _final_redraw(line: bytes) -> bytes:
    line = line.rstrip(b"\r")
    return line[line.rfind(b"\r") + 1:]


def _squeeze(rest: bytes, max_line: int) -> bytes:
    """Bound the unfinished last line carried into the next chunk.

    Only its final redraw can still be read, and only its first ``max_line`` bytes; the
    trailing ``\\r`` (if any) is kept, so that a following byte starts a new redraw.
    """
    if len(rest) <= max_line:
        return rest
    body = rest.rstrip(b"\r")
    final = body[body.rfind(b"\r") + 1:][:max_line]
    return final + rest[len(body):len(body) + 1]


def terminal_lines(fh: BinaryIO, max_line: int = DEFAULT_MAX_LINE,
                   chunk_size: int = CHUNK_SIZE) -> Iterator[tuple[int, bytes]]:
    """``(line number, text)`` of every non-empty line as a terminal shows it (see the module doc)."""
    lineno = 0
    for batch in _batches(fh, max_line, chunk_size):
        for piece in batch:
            lineno += 1
            if b"\r" in piece:
                piece = _final_redraw(piece)
            if piece:
                yield lineno, piece if len(piece) <= max_line else piece[:max_line]


class _Selector:
    """Picks the lines worth feeding to the scanner, and notes the signs read around them."""

    def __init__(self, max_line: int, progress: ProgressFormat | None = None) -> None:
        self.max_line = max_line
        self.progress = progress
        self._hints = tuple(h.encode() for h in hints_of(progress))
        self.lineno = 0
        self.last_traceback = self.last_progress = self.last_success = 0
        self.finder = CommandFinder()
        self._bar: tuple[int, bytes] | None = None  # the newest plain bar not yet handed on
        self._first_bar: tuple[int, bytes] | None = None  # the first of the run of plain bars it ends

    def select(self, batch: list[bytes]) -> list[tuple[int, str]]:
        out = []
        lineno = self.lineno
        finder = self.finder
        for raw in batch:
            lineno += 1
            if b"\r" in raw:
                raw = _final_redraw(raw)
            if not raw:
                continue
            if b"%|" in raw:  # any progress bar past its start: the process went on
                if b"| 0/" not in raw:  # (tqdm draws a 0/N bar as it closes after a traceback)
                    self.last_progress = lineno
                if self._plain(raw):
                    # A plain bar redraw carries no fault evidence (as in the live supervisor); the
                    # first and the newest of a run of them go along, as BAR lines, before the next
                    # line read (the first tells where training stood after evidence before it).
                    if self._bar is None:
                        self._first_bar = (lineno, raw)
                    self._bar = (lineno, raw)
                    continue
            if self._bar is not None:
                out.extend(self._bar_lines())
            if len(raw) > self.max_line:
                raw = raw[:self.max_line]
            text = raw.decode("utf-8", "replace")  # as LineSplitter decodes: garbage never stops us
            if b"Traceback" in raw:
                self.last_traceback = lineno
            elif self.progress is not None and self.progress.is_success(text):
                self.last_success = lineno
            if ("ommand" in text or "launch" in text or "python" in text) and finder.wanted:
                finder.offer(text)  # (the test is CommandFinder.gate, spelled out: it runs on every line)
            out.append((lineno, text))
        self.lineno = lineno
        return out

    def _plain(self, raw: bytes) -> bool:
        """A plain redraw of the trainer's progress (its format says so)."""
        return (self.progress is not None and any(h in raw for h in self._hints)
                and self.progress.is_plain_redraw(raw.decode("utf-8", "replace")))

    def finish(self) -> list[tuple[int, str]]:
        """What is still held at the end of the file: the last plain bar."""
        return [] if self._bar is None else self._bar_lines()

    def _bar_lines(self) -> list[tuple[int, str]]:
        assert self._bar is not None
        bars = [self._bar] if self._first_bar is None or self._first_bar is self._bar else [self._first_bar, self._bar]
        self._bar = self._first_bar = None
        return [(-lineno, raw[:self.max_line].decode("utf-8", "replace")) for lineno, raw in bars]


@dataclass
class _Signs:
    """What the selector noted besides the lines: where the last traceback, progress bar and
    success marker were, and the command line."""

    lineno: int = 0
    last_traceback: int = 0
    last_progress: int = 0
    last_success: int = 0
    command: list[str] | None = None
    recognised: frozenset[str] = frozenset()

    @classmethod
    def of(cls, selector: _Selector) -> _Signs:
        return cls(selector.lineno, selector.last_traceback, selector.last_progress, selector.last_success,
                   selector.finder.command, _recognised(selector.progress))


def _recognised(progress: ProgressFormat | None) -> frozenset[str]:
    """The formats of several that recognised a line so far (one trainer's format: none to tell)."""
    return frozenset(progress.recognised) if isinstance(progress, AnyProgress) else frozenset()


def _fresh(progress: ProgressFormat | None) -> None:
    """A log's scan starts with nothing recognised (``diagnose`` reads several with one ``AnyProgress``)."""
    if isinstance(progress, AnyProgress):
        progress.recognised.clear()


class _Verdict:
    """The scanner side: feeds the selected lines (a negative line number marks a plain bar)."""

    def __init__(self, rules: Sequence[FaultRule], progress: ProgressFormat | None = None) -> None:
        self.scanner = FaultScanner(rules, progress)
        self.progress = progress

    def feed(self, lines: list[tuple[int, str]]) -> None:
        feed, note_bar = self.scanner.feed, self.scanner.note_bar
        for lineno, text in lines:
            if lineno < 0:
                note_bar(text)
            else:
                feed(text, lineno)

    def result(self, signs: _Signs) -> LogScan:
        status = self.scanner.child_status
        # A traceback cut above its header still shows its frames.
        signs = replace(signs, last_traceback=max(signs.last_traceback, self.scanner.last_frame_line))
        launcher_failed = status is not None and (status[1] is not None or status[0] not in (None, 0))
        verdict = self.scanner.verdict
        failed = (launcher_failed or signs.last_traceback > max(signs.last_progress, signs.last_success)
                  or (verdict is not None and verdict.strength == "root" and verdict.lineno > signs.last_success))
        return LogScan(verdict, signs.lineno, failed, signs.last_success > 0 and not failed, signs.command,
                       self.scanner.last_lines, signs.recognised | _recognised(self.progress))


def scan_log(fh: BinaryIO, rules: Sequence[FaultRule] = BUILTIN_RULES,
             chunk_size: int = CHUNK_SIZE, progress: ProgressFormat | None = None) -> LogScan:
    """Classify one log with the live scanner; see the module doc for what is read."""
    _fresh(progress)
    verdict = _Verdict(rules, progress)
    selector = _Selector(DEFAULT_MAX_LINE, progress)
    for batch in _batches(fh, DEFAULT_MAX_LINE, chunk_size):
        verdict.feed(selector.select(batch))
    verdict.feed(selector.finish())
    return verdict.result(_Signs.of(selector))


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def scan_file(path: str, rules: Sequence[FaultRule] = BUILTIN_RULES, chunk_size: int = CHUNK_SIZE,
              parallel: bool | None = None, progress: ProgressFormat | None = None) -> LogScan:
    """``scan_log`` on a file by name.  A big file (``PARALLEL_MIN`` bytes and up, with a second
    CPU) is read and pre-selected by a second process while this one scans, in the same order:
    the verdict is the same, it only comes sooner.  Raises OSError when the file cannot be read."""
    size = os.stat(path).st_size
    if parallel is None:
        parallel = size >= PARALLEL_MIN and _usable_cpus() >= 2
    if not parallel:
        with open(path, "rb", buffering=0) as fh:
            return scan_log(fh, rules, chunk_size, progress)
    with open(path, "rb"):
        pass  # fail here, in this process, when it cannot be opened
    _fresh(progress)
    ctx = multiprocessing.get_context()
    receive, send = ctx.Pipe(duplex=False)
    reader = ctx.Process(target=_select_file, args=(path, send, chunk_size, progress), daemon=True,
                         name="trainsup-diagnose-reader")
    reader.start()
    send.close()
    verdict = _Verdict(rules, progress)
    signs = _Signs()
    try:
        while True:
            try:
                kind, payload = receive.recv()
            except EOFError:
                raise OSError(f"{path}: the reader process ended unexpectedly") from None
            if kind == "lines":
                verdict.feed(payload)
            elif kind == "command":
                signs.command = payload
            elif kind == "end":
                lineno, last_traceback, last_progress, last_success, recognised = payload
                signs = _Signs(lineno, last_traceback, last_progress, last_success, signs.command, recognised)
                break
            else:
                raise OSError(payload)
    finally:
        receive.close()
        if reader.is_alive():
            reader.terminate()  # this side failed: the rest of the file is not needed
        reader.join()
    return verdict.result(signs)


def _select_file(path: str, send: Connection, chunk_size: int, progress: ProgressFormat | None) -> None:
    """The reader process: batches of selected lines, then the signs, through ``send``."""
    selector = _Selector(DEFAULT_MAX_LINE, progress)
    command = None
    try:
        with open(path, "rb", buffering=0) as fh:
            for batch in _batches(fh, DEFAULT_MAX_LINE, chunk_size):
                lines = selector.select(batch)
                if selector.finder.command is not command:  # sent first: as scan_log sees it
                    command = selector.finder.command
                    send.send(("command", command))
                send.send(("lines", lines))
            send.send(("lines", selector.finish()))
        send.send(("end", (selector.lineno, selector.last_traceback, selector.last_progress,
                           selector.last_success, _recognised(selector.progress))))
    except OSError as exc:
        with contextlib.suppress(OSError):
            send.send(("error", f"{path}: {exc.strerror or exc}"))
    finally:
        send.close()
