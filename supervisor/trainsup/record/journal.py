"""Owns the run's record: the append-only ``events.jsonl`` and the atomically replaced ``status.json``.

Every decision is journaled as one JSON object per line with ``ts`` and ``event``. A full disk must
not kill supervision: a failed journal write is reported once on the console and counted.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .fsutil import atomic_write_text


class Journal:
    def __init__(self, run_dir: Path, clock: Callable[[], float] = time.time) -> None:
        self.run_dir = run_dir
        self.events_path = run_dir / "events.jsonl"
        self.status_path = run_dir / "status.json"
        self._clock = clock
        self._lock = threading.Lock()
        self._fh = open(self.events_path, "a", encoding="utf-8")  # noqa: SIM115 - open for the run
        self.write_errors = 0
        self._status: dict[str, Any] = {}

    def event(self, event: str, **fields: Any) -> dict[str, Any]:
        record = {"ts": round(self._clock(), 3), "event": event, **fields}
        line = json.dumps(record, default=str, ensure_ascii=False)
        with self._lock:
            try:
                self._fh.write(line + "\n")
                self._fh.flush()
            except OSError as exc:
                self._failed(exc)
        return record

    def status(self, **fields: Any) -> None:
        """Merge fields into the status snapshot and replace ``status.json`` atomically."""
        with self._lock:
            self._status.update(fields)
            self._status["updated"] = round(self._clock(), 3)
            try:
                atomic_write_text(self.status_path, json.dumps(self._status, indent=2, default=str) + "\n")
            except OSError as exc:
                self._failed(exc)

    def snapshot(self) -> dict[str, Any]:
        """The status as last written (a copy)."""
        with self._lock:
            return dict(self._status)

    def _failed(self, exc: OSError) -> None:
        self.write_errors += 1
        if self.write_errors == 1:
            print(f"trainsup: cannot write the journal in {self.run_dir}: {exc}; supervision goes on",
                  file=sys.stderr)

    def close(self) -> None:
        with self._lock:
            try:
                self._fh.close()
            except OSError:
                pass


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]

