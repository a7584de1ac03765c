"""Owns the tracebacks in sight, per rank: their frames, where each began, and what a line is to them.

The scanner reads interleaved ranks (``[rank1]:`` tags) and keeps each rank's traceback apart.  A
traceback is *in sight* of a line while its newest frame is at most ``STALE_LINES`` lines back (the
slack lets two or three interleaved ranks print between a frame and its message).  A line may then
be its exception line (``in_traceback``), a code line a frame quotes (``is_source_line``), or a
launcher's report of its child (``launcher_reports``: accelerate's or torchrun's frames).

Where a traceback began (``began``) bounds the failure an exception line ends: its header, or its
first frame when the header was cut; a traceback chained to the one before it (``During handling of
the above exception`` / ``The above exception was the direct cause``) continues that failure.
"""

from __future__ import annotations

import re

from .frames import is_launcher
from .linetext import rank_tag, strip_ansi

__all__ = ["CHAINED", "FRAME", "STALE_LINES", "TRACEBACK", "Tracebacks"]

TRACEBACK = re.compile(r"Traceback \(most recent call last\)")
FRAME = re.compile(r'^File "([^"]*)", line \d+, in (.+)$')
CHAINED = re.compile(r"^During handling of the above exception|the direct cause of the following exception")
STALE_LINES = 12


class Tracebacks:
    """The tracebacks in sight, per rank (see the module doc)."""

    def __init__(self) -> None:
        self.by_rank: dict[str, tuple[int, list[str]]] = {}  # rank -> (newest frame's line, frames)
        self._began: dict[str, int] = {}  # rank -> where the traceback in sight began
        self._chained = -(1 << 30)  # the line of the last chaining marker (none yet)

    @property
    def last_frame_line(self) -> int:
        """The line number of the newest traceback frame seen (0: none)."""
        return max((f[0] for f in self.by_rank.values()), default=0)

    def header(self, raw: str, lineno: int) -> None:
        rank = rank_tag(raw)
        self.by_rank[rank] = (lineno, [])
        if lineno - self._chained > 3:  # (a chained traceback continues the failure before it)
            self._began[rank] = lineno

    def chain(self, lineno: int) -> None:
        self._chained = lineno

    def frame(self, raw: str, lineno: int, path: str, func: str) -> tuple[str, list[str]]:
        """Record a frame (``"<file basename> <function>"``); returns its rank and the frames so far."""
        rank = rank_tag(raw)
        last = self.by_rank.get(rank)
        if last is None or lineno - last[0] > STALE_LINES:
            self._began[rank] = lineno  # a traceback whose header is not in sight
        frames = last[1] if last is not None else []
        frames.append(path.replace("\\", "/").rsplit("/", 1)[-1] + " " + func.strip())
        self.by_rank[rank] = (lineno, frames)
        return rank, frames

    def began(self, raw: str, lineno: int) -> int:
        """Where the failure a line at ``lineno`` ends began: its traceback's start, else the line itself."""
        rank = rank_tag(raw)
        last = self.by_rank.get(rank)
        if last is None or lineno - last[0] > STALE_LINES:
            return lineno
        return min(self._began.get(rank, lineno), lineno)

    def in_traceback(self, raw: str, lineno: int) -> bool:
        """Whether a line at ``lineno`` may be the exception line of a traceback in sight
        (one cut off after its header counts: it shows what ended the run)."""
        last = self.by_rank.get(rank_tag(raw))
        return last is not None and lineno - last[0] <= STALE_LINES and not is_launcher(last[1])

    def in_sight(self, raw: str, lineno: int) -> list[str] | None:
        """The frames of the traceback a line at ``lineno`` may end, if one is in sight."""
        last = self.by_rank.get(rank_tag(raw))
        if last is None or not last[1] or lineno - last[0] > STALE_LINES:
            return None
        return last[1]

    def launcher_reports(self, raw: str, lineno: int) -> bool:
        """Whether ``raw`` ends a launcher's traceback (accelerate's or torchrun's report of its child)."""
        frames = self.in_sight(raw, lineno)
        return frames is not None and is_launcher(frames)

    def is_source_line(self, raw: str, text: str, lineno: int) -> bool:
        """Whether ``text`` is the code line Python prints under a traceback frame.

        ``raise RuntimeError(f"NaN detected in latents: ...")`` quotes the wording,
        but the evidence is the exception line; code lines are indented by four
        spaces (after any prefix) and follow a frame, exception lines are not.
        """
        if self.in_sight(raw, lineno) is None:
            return False
        plain = strip_ansi(raw)
        at = plain.find(text)
        # Indented by four spaces after any decoration (and the blank a tag may add); a log
        # record's level column ("ERROR    ") and rich's continuation rows (29 blanks) are not.
        head = plain[:at]
        decoration = head.rstrip()
        return 4 <= len(head) - len(decoration) <= 8 and not decoration[-1:].isalpha()
