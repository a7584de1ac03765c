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

import queue
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..faults import matchers
from ..faults.linetext import clean_line
from ..faults.scanner import FaultScanner
from ..faults.splitter import LineSplitter

MAX_LINES_PER_CHUNK = 2000

# A cheap gate: only lines holding one of these reach a matcher.
_BOOKKEEPING = re.compile("Random states saved|saving state at step|model saved\\.|resume training from|"
                          "num batches per epoch|gradient accumulation steps|generating sample images|"
                          "saving checkpoint: ")
# Phases that print lines (and bars of their own) but move no step: each line of theirs is progress.
_PHASE_STARTS = (("generating sample images", "sampling"), ("saving checkpoint: ", "saving"),
                 ("saving state at step", "saving"))


@dataclass
class Observations:
    lines: int = 0
    skipped_lines: int = 0
    truncated_lines: int = 0
    progress: matchers.Progress | None = None
    success_seen: bool = False
    batches_per_epoch: int | None = None
    grad_accum: int | None = None
    child_status: int | None = None  # the real child's status behind a launcher (from the scanner)
    child_signal: int | None = None
    saving_state_label: int | None = None  # the trainer's label of a state save in progress


class OutputParser:
    """Thread-safe: both pump threads call ``feed``; the loop reads ``obs`` after the child ended."""

    def __init__(self, events: queue.Queue[tuple[str, Any]], scanner: FaultScanner,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.events = events
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
        self.events.put(("eof", stream))

    def _lines(self, lines: list[str]) -> None:
        newest_bar = None
        active = False
        for line in lines:
            self.obs.lines += 1
            if self._phase is not None or ("%|" in line and "steps:" not in line):
                active = True  # a caching, loading or sampling bar, or a line of a phase at work
            if "steps:" in line:
                newest_bar = line
                if line.endswith("]") and "nan" not in line:
                    # A plain bar redraw carries no fault evidence; only the newest is parsed. The
                    # scanner still hears of it: evidence that training outlived did not end the run.
                    self.scanner.note_bar(line)
                    continue
            elif _BOOKKEEPING.search(line):
                self._bookkeeping(clean_line(line))
            evidence = self.scanner.feed(line, self.obs.lines)
            if evidence is not None:
                self.events.put(("evidence", evidence))
        if newest_bar is not None:
            progress = matchers.parse_progress(newest_bar)
            if progress is not None:
                self.obs.progress = progress
                self.events.put(("progress", progress))
                if self._phase is not None and progress.step > self._phase_step:
                    self._phase = None  # back to training
        if active:
            self.activity_at = self.clock()

    def _bookkeeping(self, line: str) -> None:
        obs = self.obs
        for marker, phase in _PHASE_STARTS:
            if marker in line:
                self._phase = phase
                self._phase_step = obs.progress.step if obs.progress is not None else 0
                self.events.put(("phase", (phase, line)))
                break
        state_dir = matchers.state_completed(line)
        if state_dir is not None:
            self.events.put(("state_done", state_dir or None))
            if self._phase == "saving":  # the state's last file: the save is over, training resumes
                self._phase = None
                self.events.put(("phase", ("training", line)))
            return
        label = matchers.state_started(line)
        if label is not None:
            obs.saving_state_label = label
            return
        if matchers.is_success(line):
            obs.success_seen = True
            return
        n = matchers.batches_per_epoch(line)
        if n is not None:
            obs.batches_per_epoch = n
            return
        n = matchers.grad_accum_steps(line)
        if n is not None:
            obs.grad_accum = n
            self.events.put(("summary", None))  # the start-up summary is complete
