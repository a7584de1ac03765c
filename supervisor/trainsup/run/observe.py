"""Owns what one attempt's output tells: progress, saved states, fault evidence, the real exit status.

Fed by the pump threads (``ChunkSink``); posts the events the decision loop must act on into its
queue and keeps the rest as ``Observations`` for the end of the attempt. Lines from both streams go
through one ``FaultScanner`` in arrival order, so a traceback and the launcher noise after it are
seen in the order the trainer printed them.

For the hang clock it notes, per chunk, whether anything showed progress besides the ``steps`` bar
(another bar redrawn, or any line while a sampling pass or a save is under way) in ``activity_at``,
and posts the start of those phases; it never decides anything about hangs itself.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..faults.linetext import clean_line
from ..faults.progress import Progress
from ..faults.scanner import FaultScanner
from ..faults.splitter import LineSplitter
from ..trainers.base import OutputFormat
from .events import Eof, EventQueue, EvidenceSeen, PhaseEntered, ProgressSeen, StateDone, SummarySeen

MAX_LINES_PER_CHUNK = 2000


@dataclass
class Observations:
    lines: int = 0
    skipped_lines: int = 0
    truncated_lines: int = 0
    progress: Progress | None = None
    success_seen: bool = False
    # the trainer's start-up summary as read so far (``OutputFormat.summary``; replaced, never updated
    # in place, so the loop may read it while a pump thread reads on)
    summary: Mapping[str, Any] = field(default_factory=dict)
    child_status: int | None = None  # the real child's status behind a launcher (from the scanner)
    child_signal: int | None = None
    saving_state_label: int | None = None  # the trainer's label of a state save in progress


class OutputParser:
    """Thread-safe: both pump threads call ``feed``; the loop reads ``obs`` after the child ended."""

    def __init__(self, events: EventQueue, scanner: FaultScanner,
                 clock: Callable[[], float] = time.monotonic, fmt: OutputFormat | None = None) -> None:
        self.events = events
        self.fmt = fmt or OutputFormat()  # what the trainer's lines mean (the adapter's)
        self.scanner = scanner
        self.obs = Observations()
        self.clock = clock
        self.activity_at: float | None = None  # last chunk that showed progress besides the steps bar
        self._phase: str | None = None  # sampling or saving, until the steps bar moves on
        self._phase_step = 0
        self._splitters: dict[str, LineSplitter] = {}
        self._lock = threading.Lock()

    def feed(self, stream: str, chunk: bytes) -> None:
        with self._lock:
            splitter = self._splitters.setdefault(stream, LineSplitter())
            lines = splitter.feed(chunk)
            self.obs.truncated_lines = sum(s.truncated_lines for s in self._splitters.values())
            if len(lines) > MAX_LINES_PER_CHUNK:
                skipped = len(lines) - MAX_LINES_PER_CHUNK
                self.obs.skipped_lines += skipped
                self.obs.lines += skipped
                lines = lines[skipped:]
            self._lines(lines)

    def end(self, stream: str) -> None:
        with self._lock:
            splitter = self._splitters.get(stream)
            if splitter is not None:
                self._lines(splitter.flush())
        self.events.put(Eof(stream))

    def _lines(self, lines: list[str]) -> None:
        fmt = self.fmt
        hint, gate = fmt.progress_hint, fmt.bookkeeping
        bars: list[str] = []
        active = False
        for line in lines:
            self.obs.lines += 1
            is_bar = hint is not None and hint in line
            if fmt.any_line_is_activity or self._phase is not None or ("%|" in line and not is_bar):
                active = True  # a caching, loading or sampling bar, or a line of a phase at work
            if is_bar:
                bars.append(line)
                if fmt.is_plain_redraw(line):
                    # A plain redraw carries no fault evidence; only the newest is parsed. The
                    # scanner still hears of it: evidence that training outlived did not end the run.
                    self.scanner.note_bar(line)
                    continue
            if gate is not None and gate.search(line):
                # A bar read after a bookkeeping line would be read against what that line changed
                # (OneTrainer's epoch bar moves the epoch its step bar counts in): bars first.
                self._progress(bars)
                bars = []
                self._bookkeeping(clean_line(line))
            evidence = self.scanner.feed(line, self.obs.lines)
            if evidence is not None:
                self.events.put(EvidenceSeen(evidence))
        self._progress(bars)
        if active:
            self.activity_at = self.clock()

    def _progress(self, bars: list[str]) -> None:
        """Progress from the newest of ``bars`` that parses (redraws in between carry nothing new)."""
        for bar in reversed(bars):
            progress = self.fmt.progress(bar)
            if progress is None:
                continue
            self.obs.progress = progress
            self.events.put(ProgressSeen(progress))
            if self._phase is not None and progress.step > self._phase_step:
                self._phase = None  # back to training
            return

    def _bookkeeping(self, line: str) -> None:
        obs = self.obs
        fmt = self.fmt
        for marker, phase in fmt.phase_starts:
            if marker in line:
                self._phase = phase
                self._phase_step = obs.progress.step if obs.progress is not None else 0
                self.events.put(PhaseEntered(phase, line))
                break
        saved = fmt.state_completed(line)
        if saved is not None:
            self.events.put(StateDone(saved.dir))
            if self._phase == "saving":  # the state's last file: the save is over, training resumes
                self._phase = None
                self.events.put(PhaseEntered("training", line))
            return
        label = fmt.state_started(line)
        if label is not None:
            obs.saving_state_label = label
            return
        if fmt.is_success(line):
            obs.success_seen = True
            return
        said = fmt.summary(line)
        if said is not None:
            obs.summary = {**obs.summary, **said.facts}
            if said.complete:
                self.events.put(SummarySeen())  # the start-up summary is complete
