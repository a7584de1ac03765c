"""Owns the run dir's lock: one supervisor per run dir, and who that supervisor is.

The supervisor holds an exclusive ``flock`` on ``RUN_DIR/lock`` for its whole life and writes its
pid and start time into it. The kernel drops the lock when the process dies however it dies, so
"a lock is held" is the truth about a live supervisor; the pid inside says which one (``trainsup
stop`` signals it), and a status that says ``running`` under a free lock is a lost supervisor. The
lock also names the supervisor's host and boot id (``record.lease``): on shared storage a pid from
another host means nothing here.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from .lease import local_identity

INHERITED_FD = "TRAINSUP_INHERITED_LOCK_FD"


class LockHeld(RuntimeError):
    pass


@dataclass(frozen=True)
class Holder:
    pid: int
    started: float  # time.time() when it took the lock
    host: str = ""  # "": written before hosts were recorded (this host's)
    boot_id: str = ""


class RunLock:
    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / "lock"
        self._fh: IO[str] | None = None

    def acquire(self) -> None:
        """Take the lock or raise ``LockHeld``; ``OSError`` when the run dir cannot be used."""
        fh = self._inherited() or open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 - held for the run
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            raise LockHeld(str(self.path)) from None
        self._fh = fh
        self._write_holder()

    def _write_holder(self) -> None:
        """Write who holds the lock over the last holder's record, in the space that record has (a takeover
        on a disk kept full: truncating first frees it, and another writer may take it before ours is
        written; seen in the chaos soak under load, the new supervisor then exited 2). Where even that
        fails (a new file, a copy-on-write filesystem): no record rather than a dead supervisor's pid."""
        data = (json.dumps({"pid": os.getpid(), "started": round(time.time(), 3), **local_identity().fields()})
                + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY)  # not the lock's own O_APPEND: written from the start
        try:
            if os.pwrite(fd, data, 0) != len(data):
                raise OSError("short write")
            os.ftruncate(fd, len(data))
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)  # held, its holder unnamed (``holder``: pid 0), as while it starts
        finally:
            os.close(fd)

    def hand_over(self) -> dict[str, str]:
        """Keep the lock held across an ``exec`` of a new supervisor: the environment that tells it
        which open file it inherits (a ``flock`` belongs to the open file, not to the process)."""
        assert self._fh is not None
        os.set_inheritable(self._fh.fileno(), True)
        return {INHERITED_FD: str(self._fh.fileno())}

    def _inherited(self) -> IO[str] | None:
        raw = os.environ.pop(INHERITED_FD, "")
        if not raw.isdigit():
            return None
        try:
            same = os.path.samestat(os.fstat(int(raw)), os.stat(self.path))
        except OSError:
            return None
        if not same:
            return None  # not this run dir's lock: take ours the usual way
        os.set_inheritable(int(raw), False)
        return open(int(raw), "a+", encoding="utf-8")

    def release(self) -> None:
        if self._fh is not None:
            self._fh.close()  # closing drops the flock
            self._fh = None


def holder(run_dir: Path) -> Holder | None:
    """The live supervisor of ``run_dir``, or ``None`` when no process holds its lock."""
    path = run_dir / "lock"
    try:
        fh = open(path, encoding="utf-8")  # noqa: SIM115 - closed below
    except OSError:
        return None
    with fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                data = json.loads(fh.read() or "{}")
                return Holder(int(data["pid"]), float(data.get("started", 0)), str(data.get("host") or ""),
                              str(data.get("boot_id") or ""))
            except (ValueError, KeyError, TypeError):
                return Holder(0, 0.0)  # held, by a supervisor that has not written its pid yet
        fcntl.flock(fh, fcntl.LOCK_UN)
        return None
