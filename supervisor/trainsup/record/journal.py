"""Owns the run's record: the append-only ``events.jsonl`` and the atomically replaced ``status.json``.

Every decision is journaled as one JSON object per line with ``ts`` and ``event`` (its kind; every kind
and its fields are named in ``record.journalkinds``). A full disk must
not kill supervision: a failed write is counted, and said once a file on the console.

Whole lines, whatever the disk does. Each write is one ``os.write`` of whole lines on an ``O_APPEND``
descriptor, never a buffered file (whose flush on a full disk writes part of a line and keeps the
rest for a later flush: a record cut, the next one glued onto it). A write that fails part-way
(``ENOSPC``) is taken back: the file is truncated to where it was. The records that could not be
written are held in memory (``HELD_MAX_BYTES``; beyond that the oldest are dropped, and a
``records_lost`` record says how many) and written, in order, just before the next record that
lands. A journal opened on a file whose last line was cut anyway (its writer killed inside a write,
a power loss, an older trainsup) takes that line off and keeps its text in its first record,
``journal_line_cut``. Should a take-back fail, the next write ends the cut line first (readers skip a
line that does not parse). JSON's own escapes keep a record on one line; the three characters
that end a line for Python's ``str.splitlines`` but not for JSON (U+0085, U+2028, U+2029) are escaped
too, so every reader splits records alike.

The run's end is written on a full disk. At open the journal preallocates a reserve beside it
(``.journal-reserve``, ``RESERVE_BYTES``; removed at close). A supervisor's last record
(``END_EVENTS``) that finds no space releases the reserve and is written once more, with the records
held before it; so is the status snapshot after it. The reserve is a best effort, not a promise: a
file system that cannot preallocate (or that frees nothing on delete: snapshots, copy-on-write)
gives none, and another process may take the freed space first. What the journal cannot write, the
next supervisor says (``previous_end_unrecorded``, see ``run.takeover``). A reserve once released
is set aside again after a later write lands (at most every ``RESERVE_RETRY_S``).

Open a journal only while holding the run dir's lock: it may shorten a cut last line.

Listeners (``Journal.listen``) hear every record and every status snapshot after it is written: what
tells people and dashboards about a run (notifications, metrics) hangs off the journal, so it sees
exactly what the run decided. A listener must be quick (hand slow work to a thread of its own); one
that raises is reported once on the console and dropped, and never breaks the journal. Listeners are
called one at a time; a record a listener journals from inside its own call is written but not
passed to the listeners again (no recursion).
"""

from __future__ import annotations

import errno
import json
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from .fsutil import atomic_write_text
from .journalkinds import (
    END_EVENTS,
    JOURNAL_LINE_CUT,
    RECORDS_LOST,
)

RESERVE_NAME = ".journal-reserve"
RESERVE_BYTES = 64 * 1024  # the end records and a status snapshot need a few KiB; pages and blocks round up
RESERVE_RETRY_S = 60.0
HELD_MAX_BYTES = 32 * 1024  # records held while the disk is full: what the reserve can take besides the end
CUT_TEXT_MAX = 2000  # characters of a cut line kept in ``journal_line_cut``
TAIL_SCAN_MAX = 1024 * 1024  # how far back a cut last line is looked for
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
# JSON leaves these raw with ensure_ascii=False; str.splitlines() ends a line at each.
_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})

Write = Callable[[int, bytes], int]  # os.write's shape: the seam a test fills the disk through


class JournalListener(Protocol):
    """Hears the journal. ``on_event`` gets each record as written (``ts``, ``event`` and its fields),
    ``on_status`` each full status snapshot; ``close`` is called once when the run ends. A listener may
    also define ``bind(journal)``, called by ``Journal.listen``, to journal from a thread of its own."""

    def on_event(self, record: dict[str, Any]) -> None: ...

    def on_status(self, snapshot: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def encode_record(record: dict[str, Any]) -> bytes:
    """One record as one line of UTF-8 JSON, ``\\n`` included."""
    text = json.dumps(record, default=str, ensure_ascii=False).translate(_LINE_BREAKS)
    return (text + "\n").encode("utf-8", errors="backslashreplace")  # a lone surrogate: its JSON escape


def _open_append(path: Path) -> int:
    """An ``O_APPEND`` descriptor, readable when allowed (to find a cut last line)."""
    try:
        return os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666)
    except PermissionError:
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)


class Journal:
    def __init__(self, run_dir: Path, clock: Callable[[], float] = time.time,
                 write: Write = os.write) -> None:
        self.run_dir = run_dir
        self.events_path = run_dir / "events.jsonl"
        self.status_path = run_dir / "status.json"
        self.reserve_path = run_dir / RESERVE_NAME
        self._clock = clock
        self._write = write
        self._lock = threading.Lock()
        self._fd = _open_append(self.events_path)
        self.write_errors = 0
        self._said: set[Path] = set()  # files whose first failed write was said
        self.records_lost = 0  # held records dropped for room, not yet said by a ``records_lost`` record
        self._held: deque[bytes] = deque()
        self._held_bytes = 0
        self._cut = False  # the file may end inside a line (a take-back failed): end that line first
        self._ending = False  # an end record was journaled: the reserve may be spent
        self._reserve_tried = float("-inf")
        self._has_reserve = self._reserve()
        self._status: dict[str, Any] = {}
        self._closed = False
        self._listeners: list[JournalListener] = []
        self._dispatch = threading.RLock()  # one listener call at a time, whichever thread journals
        self._inside = threading.local()  # set while this thread is inside a listener call
        self.opened_size = self._mend_tail()  # bytes before this journal's first record: earlier supervisors'

    def listen(self, listener: JournalListener) -> None:
        """Pass every later record and status snapshot to ``listener`` (after it is written)."""
        bind = getattr(listener, "bind", None)
        if callable(bind):
            bind(self)
        with self._dispatch:
            self._listeners.append(listener)

    def event(self, event: str, **fields: Any) -> dict[str, Any]:
        record = {"ts": round(self._clock(), 3), "event": event, **fields}
        line = encode_record(record)
        with self._lock:
            if self._closed:
                return record  # a late record (a listener's thread draining at the end): dropped
            self._ending = self._ending or event in END_EVENTS
            self._append(line)
        self._tell("on_event", record)
        return record

    def status(self, **fields: Any) -> None:
        """Merge fields into the status snapshot and replace ``status.json`` atomically."""
        with self._lock:
            self._status.update(fields)
            self._status["updated"] = round(self._clock(), 3)
            text = json.dumps(self._status, indent=2, default=str) + "\n"
            error = self._replace_status(text)
            if error is not None and self._spend_reserve(error):
                self._replace_status(text)
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

    # --- whole lines (all under self._lock) ------------------------------------------------------
    def _append(self, line: bytes) -> None:
        """Write the held records and ``line`` as whole lines, in order, or hold them all."""
        self._held.append(line)
        self._held_bytes += len(line)
        while self._held_bytes > HELD_MAX_BYTES and len(self._held) > 1:
            self._held_bytes -= len(self._held.popleft())
            self.records_lost += 1
        self._flush_held()

    def _flush_held(self) -> None:
        lost = []
        if self.records_lost:
            lost.append(encode_record({"ts": round(self._clock(), 3), "event": RECORDS_LOST,
                                       "records": self.records_lost, "reason": "no space to write them"}))
        batch = b"".join([*lost, *self._held])
        error = self._write_lines(batch)
        if error is not None and self._spend_reserve(error):
            error = self._write_lines(batch)
        if error is not None:
            return
        self._held.clear()
        self._held_bytes = self.records_lost = 0
        if not self._has_reserve and self._clock() - self._reserve_tried >= RESERVE_RETRY_S:
            self._has_reserve = self._reserve()

    def _write_lines(self, data: bytes) -> OSError | None:
        """Append ``data`` whole, or leave the file as it was; the error when it could not."""
        if self._cut:
            data = b"\n" + data
        done = 0
        try:
            while done < len(data):  # one write; more only after a short one (then mostly ENOSPC)
                n = self._write(self._fd, data[done:])
                if n <= 0:
                    raise OSError(errno.EIO, "the write took no bytes")
                done += n
        except OSError as exc:
            self._failed(exc)
            if done:
                self._take_back(done)
            return exc
        self._cut = False
        return None

    def _take_back(self, n: int) -> None:
        """Truncate the last ``n`` bytes away (a part-written batch); failing that, mark the file cut."""
        try:
            os.ftruncate(self._fd, os.fstat(self._fd).st_size - n)  # the lock holder is the only writer
        except OSError:
            self._cut = True

    def _mend_tail(self) -> int:
        """Take off a last line cut short by an earlier writer and journal its text; the size after."""
        try:
            size = pos = os.fstat(self._fd).st_size
        except OSError:
            return 0
        tail = b""
        try:
            while pos > 0 and b"\n" not in tail and len(tail) < TAIL_SCAN_MAX:
                step = min(64 * 1024, pos)
                pos -= step
                tail = os.pread(self._fd, step, pos) + tail
        except OSError:  # not readable here: end whatever line it ends with (a blank line at worst)
            self._cut = size > 0
            return size
        if not tail or tail.endswith(b"\n"):
            return size
        start = tail.rfind(b"\n") + 1
        if start == 0 and pos > 0:  # no line end within reach: end the line rather than cut so much
            self._cut = True
            return size
        cut = tail[start:]
        try:
            os.ftruncate(self._fd, size - len(cut))
        except OSError:
            self._cut = True
            return size
        self._append(encode_record({"ts": round(self._clock(), 3), "event": JOURNAL_LINE_CUT,
                                    "bytes": len(cut),
                                    "text": cut.decode("utf-8", errors="replace")[:CUT_TEXT_MAX]}))
        return size - len(cut)

    def _replace_status(self, text: str) -> OSError | None:
        try:
            atomic_write_text(self.status_path, text)
        except OSError as exc:
            self._failed(exc, self.status_path)
            return exc
        return None

    # --- the reserve -----------------------------------------------------------------------------
    def _reserve(self) -> bool:
        """Preallocate the reserve; whether one is held (a killed supervisor's is taken over)."""
        self._reserve_tried = self._clock()
        if not hasattr(os, "posix_fallocate"):
            return False  # not Linux: no reserve
        try:
            fd = os.open(self.reserve_path, os.O_WRONLY | os.O_CREAT, 0o600)
        except OSError:
            return False
        try:
            os.posix_fallocate(fd, 0, RESERVE_BYTES)
            return True
        except OSError:  # no room for it, or no preallocation here: keep what blocks it got
            try:
                return os.fstat(fd).st_blocks > 0
            except OSError:
                return False
        finally:
            os.close(fd)

    def _spend_reserve(self, error: OSError) -> bool:
        """After an end record, free the reserve for a write that found no space; whether it did."""
        if not (self._ending and self._has_reserve and error.errno in NO_SPACE):
            return False
        self._has_reserve = False
        self._reserve_tried = self._clock()
        try:
            os.unlink(self.reserve_path)
        except FileNotFoundError:
            pass
        except OSError:
            return False
        return True

    def _failed(self, exc: OSError, path: Path | None = None) -> None:
        """Count a failed write; the first of each file is said once on the console."""
        self.write_errors += 1
        path = path or self.events_path
        if path not in self._said:
            self._said.add(path)
            held = "; its records are held and written when space returns" if path == self.events_path else ""
            print(f"trainsup: cannot write {path}: {exc.strerror or exc}{held}; supervision goes on",
                  file=sys.stderr)

    def close(self) -> None:
        """Close the file; records after this are dropped. Listeners are closed by their owner. Records
        still held are the supervisor's last words: tried once more, from the reserve if need be."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._held:
                self._ending = True
                self._flush_held()
            if self._held:
                print(f"trainsup: {len(self._held)} journal record(s) could not be written in {self.run_dir} "
                      "(no space); the next trainsup run here says so", file=sys.stderr)
            try:
                os.close(self._fd)
            except OSError:
                pass
            try:
                self.reserve_path.unlink(missing_ok=True)
            except OSError:
                pass


def read_events(run_dir: Path, upto: int | None = None) -> list[dict[str, Any]]:
    """The journal's records, oldest first (of its first ``upto`` bytes, if given). A line that does
    not parse is left out: the last line while its supervisor is writing it (a reader can see half a
    write), or a line an older trainsup cut (a new journal takes a cut last line off)."""
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    data = path.read_bytes()
    if upto is not None:
        data = data[:upto]
    events = []
    for line in data.split(b"\n"):  # "\n" only: str.splitlines() also breaks at characters JSON keeps
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            events.append(record)
    return events
