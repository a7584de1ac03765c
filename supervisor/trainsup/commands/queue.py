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
from ..record.textfmt import format_duration
from ..run.project import Project, ProjectError, find_project, load_project
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
from .doctor import Report, blocker_lines, doctor_project
from .pidcheck import check_supervisor

EXIT_OK = 0
EXIT_REFUSED = 1  # e.g. removing a running entry
EXIT_USAGE = 2


class NotReady(QueueError):
    """The project would fail at its start (the doctor's blockers): refused without ``--force``."""


Check = Callable[[Project, Mapping[str, str]], Report]


def run_queue(verb: str, *, state: Path | None, env: Mapping[str, str], out: TextIO, err: TextIO,
              project: str | None = None, gpus: str | None = None, priority: int = 0,
              entry_id: str | None = None, to: int | None = None, as_json: bool = False,
              force: bool = False, check: Check = doctor_project) -> int:
    store = QueueStore(state_dir(state, env))
    try:
        if verb == "add":
            assert project is not None
            try:
                path = find_project(project, env)
            except ProjectError as exc:
                raise QueueError(str(exc)) from None
            _checked(path, env, force, check, err)
            named = [g.strip() for g in gpus.split(",") if g.strip()] if gpus else None
            entry = store.add(path, named, priority)
            print(entry.id, file=out)
            _wake(store, err)
            return EXIT_OK
        if verb == "retry":
            assert entry_id is not None
            old, path = store.retry_source(entry_id)
            _checked(path, env, force, check, err)
            entry = store.retry(entry_id)
            print(entry.id, file=out)
            print(f"trainsup queue: {entry.id} runs {old.project} again ({old.id} {old.state}; from "
                  f"{path}); it resumes from the last state saved in {entry.run_dir}", file=err)
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
            print("trainsup queue: "
                  f"{'paused: running entries finish, nothing new starts' if verb == 'pause' else 'resumed'}",
                  file=err)
            _wake(store, err)
            return EXIT_OK
    except QueueError as exc:
        print(f"trainsup queue: error: {exc}", file=err)
        if isinstance(exc, (DuplicateEntry, NotReady)):
            return EXIT_USAGE
        refused = ("is running", "only queued", "only a failed or stopped")
        return EXIT_REFUSED if any(why in str(exc) for why in refused) else EXIT_USAGE
    except OSError as exc:
        print(f"trainsup queue: error: cannot use the state directory {store.root}: {exc.strerror or exc}", file=err)
        return EXIT_USAGE
    return EXIT_USAGE


def _checked(path: Path, env: Mapping[str, str], force: bool, check: Check, err: TextIO) -> None:
    """Run the adapter's doctor on the project file: its blockers refuse it (``NotReady``, naming each
    finding's flag and file), unless ``force``; its warnings are said."""
    try:
        project = load_project(path)
    except ProjectError as exc:
        raise QueueError(str(exc)) from None
    report = check(project, env)
    blockers = blocker_lines(report)
    if blockers and not force:
        raise NotReady(f"{project.name} would fail at its start: {'; '.join(blockers)}; fix {path}, or queue it "
                       "anyway with --force")
    for line in blockers:
        print(f"trainsup queue: warning: queued anyway (--force), though it would fail at its start: {line}",
              file=err)
    for finding in report.findings:
        if finding.severity == "warning":
            print(f"trainsup queue: warning: {finding.message}", file=err)


def _wake(store: QueueStore, err: TextIO) -> None:
    if ask(store.socket_path, {"op": "wake"}) is None:
        print(f"trainsup queue: note: no trainsup serve is running on {store.root}; the queue waits for one",
              file=err)


def _list(store: QueueStore, as_json: bool, out: TextIO) -> None:
    entries = store.entries()
    places = queued_positions(entries)
    if as_json:
        now = time.time()
        print(json.dumps([{**e.public(places.get(e.id)), "duration_s": _rounded(duration_s(e, now))}
                          for e in entries]), file=out)
        return
    print(queue_text(store, entries), file=out)


def queue_text(store: QueueStore, entries: Sequence[Entry], now: float | None = None) -> str:
    """The queue as ``trainsup status`` and ``queue list`` show it: a header, then a table of the
    entries with when each started and ended, how long it took (so far), its exit code and why."""
    now = time.time() if now is None else now
    places = queued_positions(list(entries))
    lines = [f"queue {store.root}: {status_text(counts(list(entries)), store.paused())}"]
    if not entries:
        return lines[0]
    rows = [["id", "state", "#", "project", "started", "ended", "took", "exit", "reason"]]
    for e in entries:
        extra = [f"priority {e.priority}"] if e.priority else []
        if e.assigned_gpus or e.gpus:
            extra.append(f"gpus {','.join(e.assigned_gpus or e.gpus or [])}")
        reason = e.reason or ""
        if extra:
            reason = f"{reason} ({', '.join(extra)})" if reason else ", ".join(extra)
        rows.append([e.id, e.state, str(places.get(e.id, "")), e.project, *entry_times(e, now),
                     "" if e.exit_code is None else str(e.exit_code), reason])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        lines.append(("  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=False))
                      + "  " + r[-1]).rstrip())
    return "\n".join(lines)


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _when(ts: float | None) -> str:
    return time.strftime("%m-%d %H:%M", time.localtime(ts)) if ts else "–"


def duration_s(entry: Entry, now: float) -> float | None:
    """How long the entry ran (so far, while it runs); None before it started."""
    if not entry.started:
        return None
    end = entry.ended if entry.ended and entry.state in ENDED else now
    return max(0.0, end - entry.started)


def entry_times(entry: Entry, now: float) -> tuple[str, str, str]:
    """When the entry started and ended, and how long it took (so far): as ``queue list`` shows them."""
    return _when(entry.started), _when(entry.ended), _took(entry, now)


def _took(entry: Entry, now: float) -> str:
    took = duration_s(entry, now)
    if took is None:
        return "–"
    return format_duration(took) + ("…" if entry.state == "running" else "")


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
