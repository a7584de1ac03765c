"""Owns ``progress.jsonl``: the run's curve, one short record per step seen and per GPU reading.

The page (``trainsup web``) draws the loss over true steps and the GPU memory over time from it. It
is a journal listener fed by the status snapshots the engine already writes (a few a second at
most), so it costs the run one small append per step it shows and nothing else; ``events.jsonl``
stays the record of decisions, short enough for every reader that decides from it.

Records, one JSON object a line:

- ``{"ts", "a": attempt, "s": true step, "t": total, "l": loss, "r": it/s}`` when the step (or the
  attempt) changed since the last one;
- ``{"ts", "a": attempt, "g": [{"i": index, "u": used MiB, "m": total MiB, "p": trainer MiB}]}``
  at most every ``GPU_INTERVAL_S`` while a GPU is read.

A failed write is counted and never breaks the run (the journal reports its own failures). Each
record is one ``os.write`` of a whole line on an ``O_APPEND`` descriptor; a write the disk cuts short
is taken back (the file truncated to where it was), so no line is ever cut or glued onto the next: the
curve may miss a point on a full disk, never read a broken one.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from typing import Any

from .journal import Journal

GPU_INTERVAL_S = 2.0
FILE_NAME = "progress.jsonl"


class ProgressLog:
    """A ``JournalListener`` writing ``RUN_DIR/progress.jsonl``."""

    def __init__(self, write: Callable[[int, bytes], int] = os.write) -> None:
        self._write_fd = write  # a seam: tests give it a disk that fills up
        self._fd: int | None = None
        self._last: tuple[Any, Any] | None = None
        self._gpu_at = float("-inf")
        self._lock = threading.Lock()
        self.write_errors = 0

    def bind(self, journal: Journal) -> None:
        try:
            self._fd = os.open(journal.run_dir / FILE_NAME, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
                               0o644)
        except OSError:
            self.write_errors += 1

    def on_event(self, record: dict[str, Any]) -> None:
        return None  # decisions are the journal's; the curve comes from the snapshots

    def on_status(self, snapshot: dict[str, Any]) -> None:
        ts, attempt, step = snapshot.get("updated"), snapshot.get("attempt"), snapshot.get("step")
        if snapshot.get("state") != "running" or not isinstance(step, int) or isinstance(step, bool):
            return
        if (attempt, step) != self._last:
            self._last = (attempt, step)
            self._write({"ts": ts, "a": attempt, "s": step, "t": snapshot.get("total"),
                         "l": snapshot.get("loss"), "r": snapshot.get("rate")})
        gpus = snapshot.get("gpu")
        if isinstance(gpus, list) and gpus and isinstance(ts, (int, float)) and ts - self._gpu_at >= GPU_INTERVAL_S:
            self._gpu_at = ts
            self._write({"ts": ts, "a": attempt, "g": [
                {"i": g.get("index"), "u": g.get("used_mib"), "m": g.get("total_mib"), "p": g.get("trainer_mib")}
                for g in gpus if isinstance(g, dict)]})

    def _write(self, record: dict[str, Any]) -> None:
        line = (json.dumps(record, separators=(",", ":"), default=str) + "\n").encode("utf-8")
        with self._lock:
            if self._fd is None:
                return
            size = None
            try:
                size = os.fstat(self._fd).st_size
                if self._write_fd(self._fd, line) != len(line):
                    raise OSError("short write")
            except OSError:
                self.write_errors += 1
                if size is not None:  # take a cut line back: the next record starts on a line of its own
                    try:
                        os.ftruncate(self._fd, size)
                    except OSError:
                        pass

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                try:
                    os.close(self._fd)
                except OSError:
                    pass
                self._fd = None
