"""Owns ``trainsup queue``: adding, listing, removing, moving entries, and pausing the queue.

Each verb edits the queue's files (see ``service.queuestore``), which works with or without a
running daemon, and then wakes the daemon through its socket so it acts at once. ``queue list``
reads the files only. ``trainsup stop ID`` (``stop_entry``) stops one entry: a queued one at once,
a running one by asking its supervisor, which stops its trainer and journals the end.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TextIO

import psutil

from ..record.runlock import Holder
from ..run.project import ProjectError, find_project
from ..service.control import ask
from ..service.daemon import status_text
from ..service.entryproc import live_supervisor
from ..service.queuestore import (
    ENDED,
    DuplicateEntry,
    Entry,
    QueueError,
    QueueStore,
    counts,
    queued_positions,
    state_dir,
)
from .pidcheck import check_supervisor

EXIT_OK = 0
EXIT_REFUSED = 1  # e.g. removing a running entry
EXIT_USAGE = 2


def run_queue(verb: str, *, state: Path | None, env: Mapping[str, str], out: TextIO, err: TextIO,
              project: str | None = None, gpus: str | None = None, priority: int = 0,
              entry_id: str | None = None, to: int | None = None, as_json: bool = False) -> int:
    store = QueueStore(state_dir(state, env))
    try:
        if verb == "add":
            assert project is not None
            try:
                path = find_project(project, env)
            except ProjectError as exc:
                raise QueueError(str(exc)) from None
            named = [g.strip() for g in gpus.split(",") if g.strip()] if gpus else None
            entry = store.add(path, named, priority)
            print(entry.id, file=out)
            _wake(store, err)
            return EXIT_OK
        if verb == "list":
            _list(store, as_json, out)
            return EXIT_OK
        if verb == "remove":
            assert entry_id is not None
            entry = store.remove(entry_id)
            print(f"trainsup queue: removed {entry.id} ({entry.project}, {entry.state}); "
                  f"its run dir {entry.run_dir} is left as it is", file=err)
            return EXIT_OK
        if verb == "move":
            assert entry_id is not None and to is not None
            order = store.move(entry_id, to)
            print(" ".join(e.id for e in order), file=out)
            _wake(store, err)
            return EXIT_OK
        if verb in ("pause", "resume"):
            store.set_paused(verb == "pause")
            print(f"trainsup queue: {'paused: running entries finish, nothing new starts' if verb == 'pause' else 'resumed'}",
                  file=err)
            _wake(store, err)
            return EXIT_OK
    except QueueError as exc:
        print(f"trainsup queue: error: {exc}", file=err)
        if isinstance(exc, DuplicateEntry):
            return EXIT_USAGE
        return EXIT_REFUSED if "is running" in str(exc) or "only queued" in str(exc) else EXIT_USAGE
    except OSError as exc:
        print(f"trainsup queue: error: cannot use the state directory {store.root}: {exc.strerror or exc}", file=err)
        return EXIT_USAGE
    return EXIT_USAGE


def _wake(store: QueueStore, err: TextIO) -> None:
    if ask(store.socket_path, {"op": "wake"}) is None:
        print(f"trainsup queue: note: no trainsup serve is running on {store.root}; the queue waits for one",
              file=err)


def _list(store: QueueStore, as_json: bool, out: TextIO) -> None:
    entries = store.entries()
    places = queued_positions(entries)
    if as_json:
        print(json.dumps([e.public(places.get(e.id)) for e in entries]), file=out)
        return
    print(queue_text(store, entries), file=out)


def queue_text(store: QueueStore, entries: Sequence[Entry]) -> str:
    """The queue as ``trainsup status`` and ``queue list`` show it."""
    places = queued_positions(list(entries))
    lines = [f"queue {store.root}: {status_text(counts(list(entries)), store.paused())}"]
    for e in entries:
        where = f"#{places[e.id]}" if e.id in places else ""
        bits = [f"{e.id:<5} {e.state:<9} {where:<4} {e.project}"]
        if e.priority:
            bits.append(f"priority={e.priority}")
        if e.assigned_gpus or e.gpus:
            bits.append(f"gpus={','.join(e.assigned_gpus or e.gpus or [])}")
        if e.state in ENDED:
            bits.append(f"exit={e.exit_code}")
        if e.reason:
            bits.append(f"reason={e.reason}")
        bits.append(f"run_dir={e.run_dir}")
        lines.append("  " + "  ".join(bits))
    return "\n".join(lines)


def find_entry(arg: str, env: Mapping[str, str], state: Path | None = None) -> tuple[QueueStore, Entry] | None:
    """The queue entry ``arg`` names in the known state directory, if it names one (a path that
    exists is a run dir or a project file, never an id)."""
    if Path(arg).expanduser().exists():
        return None
    store = QueueStore(state_dir(state, env))
    entry = store.find(arg) if store.exists() else None
    return (store, entry) if entry is not None else None


def stop_entry(store: QueueStore, entry: Entry, *, timeout: float, out: TextIO, err: TextIO,
               clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> int:
    """Stop one entry: 0 stopped (or it had ended), 1 still running after ``timeout``."""
    with store.locked():
        entry = store.get(entry.id)
        if entry.state == "queued":
            store.update(entry.id, state="stopped", reason="stopped before it started (trainsup stop)",
                         ended=round(time.time(), 3), stop_requested=True)
            print(f"trainsup stop: {entry.id} ({entry.project}) will not start", file=err)
            return 0
        if entry.state != "running":
            print(f"trainsup stop: nothing to stop: {entry.id} is {entry.state}", file=err)
            return 0
        store.update(entry.id, stop_requested=True)
    proc = live_supervisor(entry)
    if proc is None:
        print(f"trainsup stop: {entry.id} has no live supervisor; the daemon records it as stopped", file=err)
        return 0
    problem = check_supervisor(Holder(proc.pid, 0.0))
    if problem is not None:
        print(f"trainsup stop: error: {entry.id}: {problem}", file=err)
        return 1
    os.kill(proc.pid, signal.SIGTERM)
    print(f"trainsup stop: {entry.id} ({entry.project}): SIGTERM sent to pid {proc.pid}; waiting up to {timeout:g} s",
          file=err, flush=True)
    deadline = clock() + timeout
    while not _gone(proc):
        if clock() >= deadline:
            print(f"trainsup stop: error: {entry.id} (pid {proc.pid}) is still running after {timeout:g} s", file=err)
            return 1
        sleep(0.1)
    print(f"trainsup stop: {entry.id} stopped", file=out)
    return 0


def _gone(proc: psutil.Process) -> bool:
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True
