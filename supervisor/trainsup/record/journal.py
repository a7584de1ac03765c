"""Owns the run's record: the append-only ``events.jsonl`` and the atomically replaced ``status.json``.

Every decision is journaled as one JSON object per line with ``ts`` and ``event``. A full disk must
not kill supervision: a failed journal write is reported once on the console and counted.

Listeners (``Journal.listen``) hear every record and every status snapshot after it is written: what
tells people and dashboards about a run (notifications, metrics) hangs off the journal, so it sees
exactly what the run decided. A listener must be quick (hand slow work to a thread of its own); one
that raises is reported once on the console and dropped, and never breaks the journal. Listeners are
called one at a time; a record a listener journals from inside its own call is written but not
passed to the listeners again (no recursion).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from .fsutil import atomic_write_text


class JournalListener(Protocol):
    """Hears the journal. ``on_event`` gets each record as written (``ts``, ``event`` and its fields),
    ``on_status`` each full status snapshot; ``close`` is called once when the run ends. A listener may
    also define ``bind(journal)``, called by ``Journal.listen``, to journal from a thread of its own."""

    def on_event(self, record: dict[str, Any]) -> None: ...

    def on_status(self, snapshot: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


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
        self._closed = False
        self._listeners: list[JournalListener] = []
        self._dispatch = threading.RLock()  # one listener call at a time, whichever thread journals
        self._inside = threading.local()  # set while this thread is inside a listener call

    def listen(self, listener: JournalListener) -> None:
        """Pass every later record and status snapshot to ``listener`` (after it is written)."""
        bind = getattr(listener, "bind", None)
        if callable(bind):
            bind(self)
        with self._dispatch:
            self._listeners.append(listener)

    def event(self, event: str, **fields: Any) -> dict[str, Any]:
        record = {"ts": round(self._clock(), 3), "event": event, **fields}
        line = json.dumps(record, default=str, ensure_ascii=False)
        with self._lock:
            if self._closed:
                return record  # a late record (a listener's thread draining at the end): dropped
            try:
                self._fh.write(line + "\n")
                self._fh.flush()
            except OSError as exc:
                self._failed(exc)
        self._tell("on_event", record)
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
            snapshot = dict(self._status)
        self._tell("on_status", snapshot)

    def _tell(self, method: str, payload: dict[str, Any]) -> None:
        if not self._listeners or self._closed or getattr(self._inside, "active", False):
            return
        with self._dispatch:
            self._inside.active = True
            try:
                for listener in list(self._listeners):
                    try:
                        getattr(listener, method)(payload)
                    except Exception as exc:  # noqa: BLE001 - a listener never breaks the journal
                        self._listeners.remove(listener)
                        print(f"trainsup: warning: {type(listener).__name__} failed and is turned off "
                              f"({type(exc).__name__}: {exc}); supervision goes on", file=sys.stderr)
            finally:
                self._inside.active = False

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
        """Close the file; records after this are dropped. Listeners are closed by their owner."""
        with self._lock:
            self._closed = True
            try:
                self._fh.close()
            except OSError:
                pass


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    """The journal's records, oldest first. A record cut short is left out: the last line while its
    supervisor is writing it (a reader can see half a write), or one a supervisor killed mid-write
    left behind, which the next records follow."""
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    events = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            events.append(record)
    return events

