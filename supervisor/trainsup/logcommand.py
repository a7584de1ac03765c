"""Owns finding the trainer's command line in a log, so that a diagnosis can correct it.

kohya's scripts do not echo their argv, but what launched them often does: GUIs and wrappers
print ``Running command: ...`` / ``Executing command: ...``, shell transcripts hold the
``accelerate launch ...`` or ``python ... train_network.py ...`` line itself, and accelerate's
``CalledProcessError`` names the child's argv as a Python list when the run fails.  An explicit
line (the first one) is preferred; the launcher's list is the fallback, since it lacks the
``accelerate launch`` part.  A candidate counts only when ``cmdline.TrainerCommand`` finds a
training script in it.
"""

from __future__ import annotations

import ast
import os
import re
import shlex

from .cmdline import TrainerCommand, find_script
from .linetext import clean_line

__all__ = ["CommandFinder", "command_from_line"]

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
