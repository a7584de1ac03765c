"""Owns taking a run dir over from the previous supervisor: surviving its death, and telling a run
that goes on from one that is over.

While an attempt runs, ``RUN_DIR/trainer.json`` names the trainer's process group and every process
of its tree with its start time (pids get reused: a pid counts as ours only with the same start
time). A supervisor that ends an attempt removes the record. So a record found at start-up means
the previous supervisor was SIGKILLed or the box lost power; the new supervisor holds the run dir's
lock, so that one is dead. Before anything else it stops whatever is left of that trainer (never two
trainers on one output dir) and journals the lost attempt's end (``attempt_end`` with
``supervisor_lost: true``); the engine then resumes from the newest complete state in the ledger.

A record names the host and boot id it was written on (``record.lease``). Pids recorded by another
host, or by this host before a reboot, mean nothing here: they are never signalled (journal
``orphan_not_signalled``). Another host's trainer is that host's to stop (its supervisor is dead:
the lease said so); an earlier boot's processes are gone. The run resumes as after any lost supervisor.

The ledger goes on unless the previous run finished: a run stopped, given up or lost resumes from
its newest complete state when started again (``systemctl restart``, ``trainsup run`` once more);
after a finished run the same command trains anew, and the old ledger is kept as ``ledger-N.json``.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from ..record.fsutil import atomic_write_text
from ..record.journal import Journal, read_events
from ..record.lease import EARLIER_BOOT, HERE, Identity, local_identity, origin

TRAINER_FILE = "trainer.json"
SAME_START_S = 0.05  # psutil's create_time is rounded; a reused pid starts far later than that


def record_trainer(run_dir: Path, root_pid: int, attempt: int) -> None:
    """Write (or refresh, as the tree grows) the record of the running trainer's processes."""
    procs: list[dict[str, Any]] = []
    try:
        root = psutil.Process(root_pid)
        for proc in [root, *root.children(recursive=True)]:
            try:
                procs.append({"pid": proc.pid, "started": proc.create_time()})
            except psutil.Error:
                continue
    except psutil.Error:
        return  # gone already: nothing would be left to stop
    record = {"supervisor_pid": os.getpid(), **local_identity().fields(), "attempt": attempt, "pgid": root_pid,
              "procs": procs}
    try:
        atomic_write_text(run_dir / TRAINER_FILE, json.dumps(record) + "\n")
    except OSError:
        pass  # a full disk must not end supervision; the lock still keeps a second supervisor out


def forget_trainer(run_dir: Path) -> None:
    try:
        (run_dir / TRAINER_FILE).unlink(missing_ok=True)
    except OSError:
        pass


def _survivors(record: dict[str, Any]) -> list[psutil.Process]:
    """The recorded processes still running (same pid and start time), and any later member of the
    recorded process group started after the trainer (a worker the record had not seen yet)."""
    found: dict[int, psutil.Process] = {}
    starts = [float(p["started"]) for p in record.get("procs", [])]
    for entry in record.get("procs", []):
        try:
            proc = psutil.Process(int(entry["pid"]))
            if abs(proc.create_time() - float(entry["started"])) <= SAME_START_S:
                found[proc.pid] = proc
        except (psutil.Error, KeyError, ValueError, TypeError):
            continue
    pgid = record.get("pgid")
    if isinstance(pgid, int) and starts:
        for proc in psutil.process_iter(["pid", "create_time"]):
            try:
                if os.getpgid(proc.pid) == pgid and proc.create_time() >= min(starts) - SAME_START_S:
                    found.setdefault(proc.pid, proc)
            except (psutil.Error, OSError):
                continue
    return [p for p in found.values() if p.pid != os.getpid()]


def _stop(procs: list[psutil.Process], grace_s: float) -> None:
    for proc in procs:
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=5)


def take_over(run_dir: Path, journal: Journal, say: Callable[[str], None], grace_s: float,
              me: Identity | None = None) -> None:
    """Before the run starts: clean up after a supervisor that died mid-attempt, and set the ledger
    of a finished run aside."""
    recover_lost_run(run_dir, journal, say, grace_s, me)
    ledger = run_dir / "ledger.json"
    if ledger.exists() and _previous_run_finished(run_dir):
        n = 1 + sum(1 for _ in run_dir.glob("ledger-*.json"))
        try:
            ledger.replace(run_dir / f"ledger-{n}.json")
        except OSError as exc:
            say(f"warning: cannot set the finished run's ledger aside ({exc.strerror or exc})")


def _previous_run_finished(run_dir: Path) -> bool:
    ended = None
    try:
        for event in read_events(run_dir):
            if event.get("event") in ("run_start", "finished"):
                ended = event["event"]
    except (OSError, ValueError):
        return False
    return ended == "finished"


def recover_lost_run(run_dir: Path, journal: Journal, say: Callable[[str], None], grace_s: float,
                     me: Identity | None = None) -> int | None:
    """Clean up after a supervisor that died mid-attempt; the lost attempt's number, or ``None``."""
    path = run_dir / TRAINER_FILE
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        record = None
    except (OSError, ValueError):
        record = {}  # a torn record: nothing to trust in it but that an attempt was running
    lost = _unended_attempt(run_dir)
    if record is None and lost is None:
        return None
    where = origin(record or {}, me or local_identity())
    if where != HERE:
        _not_signalled(record or {}, where, journal, say)
    survivors = _survivors(record or {}) if where == HERE else []
    if survivors:
        pids = sorted(p.pid for p in survivors)
        say(f"the trainer of a supervisor that died is still running (pids {', '.join(map(str, pids))}): "
            "stopping it before anything else")
        started = time.monotonic()
        _stop(survivors, grace_s)
        journal.event("orphan_stopped", pids=pids, attempt=(record or {}).get("attempt"),
                      seconds=round(time.monotonic() - started, 3))
    if lost is not None:
        journal.event("attempt_end", attempt=lost, supervisor_lost=True, exit_code=None, signal=None)
        say(f"attempt {lost} lost its supervisor; resuming from the newest complete state")
    forget_trainer(run_dir)
    return lost


def _not_signalled(record: dict[str, Any], where: str, journal: Journal, say: Callable[[str], None]) -> None:
    pids = sorted(int(p["pid"]) for p in record.get("procs", []) if isinstance(p, dict) and "pid" in p)
    host = record.get("host")
    if where == EARLIER_BOOT:
        say(f"the lost trainer was recorded before this host rebooted (boot {record.get('boot_id')}): "
            "its processes are gone; not signalling its pids")
    else:
        say(f"the lost trainer was recorded on host {host} (pids {', '.join(map(str, pids)) or 'none'}): "
            "pids there mean nothing here; not signalling them (that host's trainer is that host's to stop)")
    journal.event("orphan_not_signalled", host=host, boot_id=record.get("boot_id"), pids=pids, why=where,
                  attempt=record.get("attempt"))


def _unended_attempt(run_dir: Path) -> int | None:
    """The last attempt the journal saw start but never end."""
    try:
        events = read_events(run_dir)
    except (OSError, ValueError):
        return None  # a torn last line: the record above still covers the processes
    started: int | None = None
    for event in events:
        if event.get("event") == "attempt_start":
            started = event.get("attempt")
        elif event.get("event") == "attempt_end" and event.get("attempt") == started:
            started = None
    return started
