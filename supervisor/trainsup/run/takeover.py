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

A supervisor's last record ends its stretch of the journal (``record.journal.END_EVENTS``). A
journal whose last ``run_start`` has none after it belongs to a supervisor that never recorded its
end: it was killed, or crashed, or the disk had no room even for its reserve. The new supervisor says
so in one line and journals ``previous_end_unrecorded`` with what it knows (that supervisor's start,
its last record, attempt and fault, and what its ``status.json`` said last), then goes on as usual.

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

from ..record import journalkinds as kinds
from ..record.fsutil import atomic_write_text
from ..record.journal import Journal, read_events
from ..record.journalkinds import END_EVENTS
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
    unrecorded = previous_end_unrecorded(run_dir, journal.opened_size)
    recover_lost_run(run_dir, journal, say, grace_s, me)
    if unrecorded is not None:
        journal.event(kinds.PREVIOUS_END_UNRECORDED, **unrecorded)
        say(_unrecorded_line(unrecorded))
    ledger = run_dir / "ledger.json"
    finished = unrecorded is not None and unrecorded.get("status_state") == "finished"  # status.json said it
    if ledger.exists() and (finished or _previous_run_finished(run_dir)):
        n = 1 + sum(1 for _ in run_dir.glob("ledger-*.json"))
        try:
            ledger.replace(run_dir / f"ledger-{n}.json")
        except OSError as exc:
            say(f"warning: cannot set the finished run's ledger aside ({exc.strerror or exc})")


def _previous_run_finished(run_dir: Path) -> bool:
    ended = None
    try:
        for event in read_events(run_dir):
            if event.get("event") in (kinds.RUN_START, kinds.FINISHED):
                ended = event["event"]
    except (OSError, ValueError):
        return False
    return ended == "finished"


def previous_end_unrecorded(run_dir: Path, upto: int | None = None) -> dict[str, Any] | None:
    """What is known of the last supervisor in the journal (its first ``upto`` bytes: the records
    before this supervisor's) when it recorded no end; ``None`` when it did, or none ran."""
    try:
        events = read_events(run_dir, upto)
    except OSError:
        return None
    starts = [i for i, e in enumerate(events) if e.get("event") == kinds.RUN_START]
    if not starts:
        return None
    stretch = events[starts[-1]:]
    if any(e.get("event") in END_EVENTS for e in stretch):
        return None
    last = stretch[-1]
    known: dict[str, Any] = {"started": stretch[0].get("ts"), "last_event": last.get("event"),
                             "last_ts": last.get("ts")}
    attempts = [e.get("attempt") for e in stretch if e.get("event") == kinds.ATTEMPT_START]
    faults = [e.get("class") for e in stretch if e.get("event") == kinds.FAULT]
    if attempts:
        known["attempt"] = attempts[-1]
    if faults:
        known["fault"] = faults[-1]
    try:
        status = json.loads((run_dir / "status.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        status = None
    started = known["started"] if isinstance(known["started"], (int, float)) else 0.0
    if isinstance(status, dict) and isinstance(status.get("updated"), (int, float)) \
            and status["updated"] >= started and status.get("state") in ("finished", "gave_up", "stopped"):
        known.update(status_state=status["state"], exit_code=status.get("exit_code"), reason=status.get("reason"))
    return known


def _clock_time(ts: Any) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if isinstance(ts, (int, float)) else "?"


def _unrecorded_line(known: dict[str, Any]) -> str:
    last = f"{known['last_event']}"
    if known.get("last_event") == "fault" and known.get("fault"):
        last += f" {known['fault']}"
    if known.get("attempt") is not None:
        last += f" (attempt {known['attempt']})"
    line = (f"the previous supervisor (started {_clock_time(known['started'])}) left no end in the journal "
            f"(killed, or no space to write it); its last record: {last} at {_clock_time(known['last_ts'])}")
    if known.get("status_state"):
        code = known.get("exit_code")
        line += f"; status.json says {known['status_state']}" + (f", exit {code}" if code is not None else "")
        if known.get("reason"):
            line += f" ({known['reason']})"
    return line


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
        journal.event(kinds.ORPHAN_STOPPED, pids=pids, attempt=(record or {}).get("attempt"),
                      seconds=round(time.monotonic() - started, 3))
    if lost is not None:
        journal.event(kinds.ATTEMPT_END, attempt=lost, supervisor_lost=True, exit_code=None, signal=None)
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
    journal.event(kinds.ORPHAN_NOT_SIGNALLED, host=host, boot_id=record.get("boot_id"), pids=pids, why=where,
                  attempt=record.get("attempt"))


def _unended_attempt(run_dir: Path) -> int | None:
    """The last attempt the journal saw start but never end."""
    try:
        events = read_events(run_dir)
    except (OSError, ValueError):
        return None  # a torn last line: the record above still covers the processes
    started: int | None = None
    for event in events:
        if event.get("event") == kinds.ATTEMPT_START:
            started = event.get("attempt")
        elif event.get("event") == kinds.ATTEMPT_END and event.get("attempt") == started:
            started = None
    return started
