"""Owns reading a run's records for the page, incrementally: ``events.jsonl`` and ``progress.jsonl``.

A page that refreshes every second must not re-read a journal of hundreds of thousands of lines each
time: each file is read from where the last read stopped (its inode and size tell a replaced or
shortened file, which is then read anew). Only complete lines are taken; a line that is not a JSON
object is counted as broken and shown as such, never raised. The last line while the supervisor is
writing it is not complete yet, so it is left for the next read.

What is kept per run: the records the timeline and the curve need (progress as compact arrays:
attempt, true step, loss; GPU readings; decisions), bounded in memory by ``MAX_POINTS`` progress
points (beyond that every other point is dropped, evenly, which the server-side downsampling of
``plots`` would have dropped anyway).
"""

from __future__ import annotations

import json
import math
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..record.journalkinds import (
    FILE_CHANGED,
    RUN_START,
    SAMPLE_HIDDEN,
    SAMPLE_PUBLISHED,
    SAVE_HIDDEN,
    SAVE_PRUNED,
    STATE_SAVED,
)

MAX_POINTS = 400_000
MAX_EVENTS = 20_000  # decisions kept for the timeline (a run with more shows the newest)
CHUNK = 4 * 1024 * 1024
# Journal records the page does not show: they would drown the timeline (one per save, per edit).
QUIET = frozenset({SAVE_HIDDEN, SAVE_PRUNED, STATE_SAVED, FILE_CHANGED, SAMPLE_PUBLISHED, SAMPLE_HIDDEN})


@dataclass
class JsonlTail:
    """One JSONL file read from where the last read stopped."""

    path: Path
    offset: int = 0
    inode: int | None = None
    broken: int = 0  # complete lines that were not a JSON object

    def read_new(self) -> tuple[list[dict[str, Any]], bool]:
        """The records appended since the last call, and whether the file was read anew from 0."""
        try:
            st = os.stat(self.path)
        except OSError:
            return [], False
        reset = self.inode is not None and (st.st_ino != self.inode or st.st_size < self.offset)
        if reset:
            self.offset, self.broken = 0, 0
        self.inode = st.st_ino
        if st.st_size == self.offset:
            return [], reset
        records: list[dict[str, Any]] = []
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                while True:
                    data = fh.read(CHUNK)
                    if not data:
                        break
                    end = data.rfind(b"\n")
                    if end < 0:
                        if len(data) < CHUNK:
                            break  # only a line being written: the next read takes it
                        end = len(data) - 1  # a line longer than a chunk: never ours, counted broken
                    self._parse(data[:end + 1], records)
                    self.offset += end + 1
                    fh.seek(self.offset)
        except OSError:
            pass
        return records, reset

    def _parse(self, block: bytes, into: list[dict[str, Any]]) -> None:
        for raw in block.split(b"\n"):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
            except ValueError:
                self.broken += 1
                continue
            if isinstance(record, dict):
                into.append(record)
            else:
                self.broken += 1


@dataclass
class RunRecords:
    """What the page knows of one run from its files."""

    run_dir: Path
    events: JsonlTail = field(init=False)
    progress: JsonlTail = field(init=False)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    run_start: dict[str, Any] | None = None
    attempts: list[int] = field(default_factory=list)  # per progress point
    steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)  # NaN where the trainer showed none
    times: list[float] = field(default_factory=list)
    gpu: list[tuple[float, int | None, list[dict[str, Any]]]] = field(default_factory=list)
    stride: int = 1  # keep every stride-th point once MAX_POINTS is reached
    seen: int = 0
    version: int = 0  # grows with every change: what the page drew from an older one is stale
    lock: threading.Lock = field(default_factory=threading.Lock)
    drawn: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # what the page drew, by what it drew from

    def __post_init__(self) -> None:
        self.events = JsonlTail(self.run_dir / "events.jsonl")
        self.progress = JsonlTail(self.run_dir / "progress.jsonl")

    def refresh(self) -> None:
        with self.lock:
            new, reset = self.events.read_new()
            if new or reset:
                self.version += 1
            if reset:
                self.decisions, self.run_start = [], None
            for record in new:
                kind = record.get("event")
                if not isinstance(kind, str) or kind in QUIET:
                    continue
                if kind == RUN_START:
                    self.run_start = record
                self.decisions.append(record)
            if len(self.decisions) > MAX_EVENTS:
                del self.decisions[:len(self.decisions) - MAX_EVENTS]
            new, reset = self.progress.read_new()
            if new or reset:
                self.version += 1
            if reset:
                self.attempts, self.steps, self.losses, self.times, self.gpu = [], [], [], [], []
                self.stride, self.seen = 1, 0
            for record in new:
                self._progress(record)

    def _progress(self, record: dict[str, Any]) -> None:
        ts = _num(record.get("ts"))
        attempt = record.get("a") if isinstance(record.get("a"), int) else None
        if "g" in record:
            if ts is not None and isinstance(record["g"], list):
                self.gpu.append((ts, attempt, [g for g in record["g"] if isinstance(g, dict)]))
                if len(self.gpu) > MAX_POINTS // 4:
                    del self.gpu[::2]
            return
        step = record.get("s")
        if not isinstance(step, int) or isinstance(step, bool):
            return
        self.seen += 1
        if self.seen % self.stride:
            return
        self.attempts.append(attempt or 0)
        self.steps.append(step)
        loss = _num(record.get("l"))
        self.losses.append(math.nan if loss is None else loss)
        self.times.append(ts or 0.0)
        if len(self.steps) >= MAX_POINTS:  # halve, evenly: the plot downsamples far below this anyway
            for seq in (self.attempts, self.steps, self.losses, self.times):
                del seq[1::2]
            self.stride *= 2


def _num(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


class Records:
    """Every run's records, by run dir, kept between requests."""

    def __init__(self) -> None:
        self._runs: dict[Path, RunRecords] = {}
        self._lock = threading.Lock()

    def of(self, run_dir: Path) -> RunRecords:
        with self._lock:
            found = self._runs.get(run_dir)
            if found is None:
                found = self._runs[run_dir] = RunRecords(run_dir)
        found.refresh()
        return found
