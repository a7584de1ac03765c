"""Owns ``trainsup stop``: asking a run's supervisor to stop, and waiting until it has.

The supervisor is the process holding the run dir's lock; the lock file names its pid. Before the
SIGTERM, the pid is checked to be that supervisor still: alive, created no later than the lock was
taken (a pid the kernel handed to a newer process after the supervisor's death fails this), and a
trainsup process by its command line. SIGTERM is what ``trainsup run`` treats as a stop request: it
stops the trainer's whole process group (SIGTERM, ``stop.grace_s``, SIGKILL), journals the end and
drops the lock. So "stopped" means the lock is free, or held by another pid (a new supervisor).

On shared storage the owner may be another host (the lock or a live lease names it,
``record.lease``): a pid recorded there means nothing here, so nothing is signalled; stop says which
host owns the run (exit 1) and is to be run there.

The trainer itself is never signalled from here: the supervisor alone knows its process group and
records the run's end; signalling around it would leave a ``lost`` run.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TextIO

from ..record.lease import OTHER_HOST, local_identity, origin, read_lease
from ..record.runlock import Holder, holder
from .pidcheck import check_supervisor
from .runref import RefError, resolve
from .status import format_line, view

__all__ = ["run_stop"]

EXIT_STOPPED = 0  # also: nothing was running
EXIT_STILL_RUNNING = 1
EXIT_USAGE = 2
PID_WAIT_S = 2.0  # the lock is taken a moment before the pid is written into it
POLL_S = 0.1


def run_stop(arg: str, *, timeout: float, env: Mapping[str, str], out: TextIO, err: TextIO,
             clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> int:
    """Stop the run ``arg`` names: 0 stopped (or nothing ran), 1 still running, 2 no such run."""
    try:
        ref = resolve(arg, env)
        run_dir = ref.usable()
    except RefError as exc:
        print(f"trainsup stop: error: {exc}", file=err)
        return EXIT_USAGE
    sup = _holder_with_pid(run_dir, clock, sleep)
    owner = _other_host(run_dir, sup, env)
    if owner is not None:
        print(f"trainsup stop: error: {ref.name} is owned by {owner}: pids there mean nothing on this host; "
              "run trainsup stop on that host", file=err)
        return EXIT_STILL_RUNNING
    if sup is None:
        print(f"trainsup stop: nothing to stop: no supervisor holds {run_dir / 'lock'}", file=err)
        print(format_line(view(ref)), file=out)
        return EXIT_STOPPED
    if sup.pid == 0:
        print(f"trainsup stop: error: {run_dir / 'lock'} is held but names no pid; not signalling a guess",
              file=err)
        return EXIT_STILL_RUNNING
    problem = check_supervisor(sup)
    if problem is None:
        try:
            os.kill(sup.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass  # it ended between the check and the signal: the wait below sees the lock free
        except PermissionError:
            problem = f"not allowed to signal pid {sup.pid} (another user's run?)"
    if problem is not None:
        if _still_held_by(run_dir, sup.pid):
            print(f"trainsup stop: error: {run_dir}: {problem}", file=err)
            return EXIT_STILL_RUNNING
        print(format_line(view(ref)), file=out)  # it ended on its own meanwhile
        return EXIT_STOPPED
    print(f"trainsup stop: {ref.name}: SIGTERM sent to pid {sup.pid}; waiting up to {timeout:g} s", file=err,
          flush=True)
    deadline = clock() + timeout
    while _still_held_by(run_dir, sup.pid):
        if clock() >= deadline:
            print(f"trainsup stop: error: {ref.name} (pid {sup.pid}) is still running after {timeout:g} s; "
                  "it may still be waiting for its trainer to exit (stop.grace_s)", file=err)
            return EXIT_STILL_RUNNING
        sleep(POLL_S)
    print(format_line(view(ref)), file=out)
    return EXIT_STOPPED


def _other_host(run_dir: Path, sup: Holder | None, env: Mapping[str, str]) -> str | None:
    """The owner of the run when it is a supervisor on another host: the lock's holder, or a live lease
    (a lock taken on another host may not show here)."""
    me = local_identity(env)
    if sup is not None and origin({"host": sup.host, "boot_id": sup.boot_id}, me) == OTHER_HOST:
        return f"host {sup.host} (pid {sup.pid})"
    lease = read_lease(run_dir)
    if sup is None and lease is not None and lease.live(time.time()) \
            and origin({"host": lease.host, "boot_id": lease.boot_id}, me) == OTHER_HOST:
        return lease.describe(time.time())
    return None


def _holder_with_pid(run_dir: Path, clock: Callable[[], float], sleep: Callable[[float], None]) -> Holder | None:
    """The lock's holder, waiting briefly for a supervisor that has taken the lock to write its pid."""
    deadline = clock() + PID_WAIT_S
    while True:
        sup = holder(run_dir)
        if sup is None or sup.pid > 0 or clock() >= deadline:
            return sup
        sleep(POLL_S)


def _still_held_by(run_dir: Path, pid: int) -> bool:
    sup = holder(run_dir)
    return sup is not None and sup.pid == pid
