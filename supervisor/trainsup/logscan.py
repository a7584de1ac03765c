"""Owns reading a finished log file the way the fault scanner should see it, fast enough for many GB.

``trainsup diagnose`` feeds the live supervisor's ``FaultScanner`` (same rules, same scanner) with
the lines of a saved log.  The file is read in large binary chunks and never held whole; lines end
at ``\\n`` and are capped at ``splitter.DEFAULT_MAX_LINE`` like the live splitter's.

A line that holds ``\\r`` redraws (tqdm's bars) is read as a terminal shows it: its final redraw,
the text after the last ``\\r`` (a trailing ``\\r``, as in ``\\r\\n``, overwrites nothing).  Output
that ends a line, a traceback glued to a bar included, is therefore always read; what a later
redraw overwrote was a progress bar (logging, print and tracebacks end with ``\\n``).  This is
what makes multi-GB logs cheap: a training bar redrawn a million times costs one line.  A NaN
loss is not lost by it either: kohya's running average stays NaN once it is.  A file whose first
MiB holds ``\\r`` but no ``\\n`` is taken for ``\\r``-terminated (old Mac style) and every
``\\r`` then ends a line.  As in the live supervisor, a plain ``steps`` bar (ending in ``]``,
without ``nan``) is not fed to the scanner.

Line numbers are the ones editors, ``sed -n Np`` and ``grep -n`` give: ``\\n`` starts a line.
The first root evidence decides the verdict, so reading stops there.

The log may also show the trainer's command line, which a diagnosis can then correct.  kohya's
scripts do not echo their argv, but what launched them often does: GUIs and wrappers print
``Running command: ...`` / ``Executing command: ...``, shell transcripts hold the ``accelerate
launch ...`` or ``python ... train_network.py ...`` line itself, and accelerate's
``CalledProcessError`` names the child's argv as a Python list.  The first explicit line wins; the
launcher's list (which lacks ``accelerate launch``) is the fallback.  A candidate counts only when
``cmdline.TrainerCommand`` finds a training script in it.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import BinaryIO

from . import matchers
from .cmdline import TrainerCommand, find_script
from .fault_rules import BUILTIN_RULES, FaultRule
from .faults import Evidence, FaultScanner
from .linetext import clean_line
from .splitter import DEFAULT_MAX_LINE, LineSplitter

__all__ = ["CHUNK_SIZE", "CommandFinder", "LogScan", "command_from_line", "scan_log", "terminal_lines"]

CHUNK_SIZE = 1 << 20
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
    try:
        command = TrainerCommand.parse(argv)
        token = command.launcher[find_script(command.launcher)]
    except ValueError:
        return False
    return "train" in os.path.basename(token.replace("\\", "/")).lower()


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
    lines: int  # lines read (up to the verdict when reading stopped there)
    stopped_early: bool  # root evidence decided the verdict before the end of the file
    failed: bool  # the run visibly failed: the launcher reported it, or a traceback ended the output
    success: bool  # kohya's "model saved." with no failure after it
    command: list[str] | None  # the trainer's command line, when the log shows it


def terminal_lines(fh: BinaryIO, max_line: int = DEFAULT_MAX_LINE,
                   chunk_size: int = CHUNK_SIZE) -> Iterator[tuple[int, bytes]]:
    """``(line number, text)`` of every non-empty line as a terminal shows it (see the module doc)."""
    sep = b"\n"
    lineno = 0
    tail = b""
    first = True
    while chunk := fh.read(chunk_size):
        if first:
            first = False
            if b"\n" not in chunk and b"\r" in chunk:
                sep = b"\r"  # \r-terminated lines: no redraws to collapse
        data = tail + chunk if tail else chunk
        pieces = data.split(sep)
        tail = _squeeze(pieces.pop(), max_line)
        for piece in pieces:
            lineno += 1
            if b"\r" in piece:
                piece = _final_redraw(piece)
            if piece:
                yield lineno, piece if len(piece) <= max_line else piece[:max_line]
    if tail:
        piece = _final_redraw(tail) if b"\r" in tail else tail
        if piece:
            yield lineno + 1, piece[:max_line]


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


def scan_log(fh: BinaryIO, rules: Sequence[FaultRule] = BUILTIN_RULES,
             chunk_size: int = CHUNK_SIZE) -> LogScan:
    """Classify one log with the live scanner; see the module doc for what is read."""
    scanner = FaultScanner(rules)
    feed = scanner.feed
    finder = CommandFinder()
    lineno = 0
    last_traceback = last_progress = last_success = 0
    stopped = False
    for lineno, raw in terminal_lines(fh, chunk_size=chunk_size):
        if b"steps:" in raw:
            last_progress = lineno
            if raw.endswith(b"]") and b"nan" not in raw:
                continue  # a plain bar redraw carries no fault evidence (as in the live supervisor)
        text = _decode(raw)
        if b"Traceback" in raw:
            last_traceback = lineno
        elif b"model saved." in raw and matchers.is_success(clean_line(text)):
            last_success = lineno
        if finder.wanted and finder.gate(text):
            finder.offer(text)
        if feed(text, lineno) is not None:
            verdict = scanner.verdict
            if verdict is not None and verdict.strength == "root":
                stopped = True  # the first root evidence is final: nothing later can change it
                break
    status = scanner.child_status
    launcher_failed = status is not None and (status[1] is not None or status[0] not in (None, 0))
    failed = launcher_failed or last_traceback > max(last_progress, last_success)
    return LogScan(scanner.verdict, lineno, stopped, failed, last_success > 0 and not failed,
                   finder.command)


def find_command_near_end(fh: BinaryIO, size: int, window: int = 256 * 1024) -> list[str] | None:
    """The command line shown in the last ``window`` bytes of a seekable log (launcher noise
    such as accelerate's ``CalledProcessError`` names the trainer's command)."""
    fh.seek(max(0, size - window))
    finder = CommandFinder()
    for _, raw in terminal_lines(fh):
        text = _decode(raw)
        if finder.gate(text):
            finder.offer(text)
    return finder.command
