"""Owns who a supervisor is across hosts (host name and boot id) and the lease it renews on the run dir.

A run dir may live on shared storage (NFS and friends) and be seen by many hosts. A pid means
something only on the host, and in the boot, that recorded it: the lock, ``trainer.json`` and the
lease carry ``host`` and ``boot_id`` so a reader can tell "here", "another host" and "this host's
earlier boot" apart (``origin``). The host is ``socket.gethostname()``, or ``$TRAINSUP_HOST_ID``
when set (for containers that share a host name, and for tests that play two hosts on one box);
the boot id is the kernel's ``/proc/sys/kernel/random/boot_id``.

``flock`` is not reliable across hosts on every shared filesystem, so the supervisor holding the
lock also renews ``RUN_DIR/lease.json`` (host, boot id, pid, renewed-at, the staleness window),
written atomically every few seconds from its decision loop. A lease renewed within the window
means a live supervisor; an older one is a dead supervisor's. Renewed-at is wall-clock time, so the
hosts' clocks must agree to well within the window (NTP does).
"""

from __future__ import annotations

import functools
import json
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .fsutil import atomic_write_text

HOST_ENV = "TRAINSUP_HOST_ID"
LEASE_FILE = "lease.json"
DEFAULT_STALE_S = 60.0
HERE, OTHER_HOST, EARLIER_BOOT = "here", "other_host", "earlier_boot"


@functools.cache
def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
    except OSError:
        return ""  # not Linux: a reboot cannot be told; records count as this boot's


@dataclass(frozen=True)
class Identity:
    host: str
    boot_id: str

    def fields(self) -> dict[str, str]:
        return {"host": self.host, "boot_id": self.boot_id}


def local_identity(env: Mapping[str, str] = os.environ) -> Identity:
    return Identity(env.get(HOST_ENV, "").strip() or socket.gethostname(), _boot_id())


def origin(record: Mapping[str, Any], me: Identity) -> str:
    """Where a record's pids live: ``here``, ``other_host`` or ``earlier_boot``. A record without a
    host was written by a trainsup before hosts were recorded, on this host."""
    host, boot = record.get("host"), record.get("boot_id")
    if not isinstance(host, str) or not host:
        return HERE
    if host != me.host:
        return OTHER_HOST
    if isinstance(boot, str) and boot and me.boot_id and boot != me.boot_id:
        return EARLIER_BOOT
    return HERE


@dataclass(frozen=True)
class Lease:
    host: str
    boot_id: str
    pid: int
    renewed: float  # time.time() of the last renewal
    stale_s: float = DEFAULT_STALE_S  # the writer's window, for readers without its policy (status, stop)

    def age(self, now: float) -> float:
        return max(0.0, now - self.renewed)

    def live(self, now: float, stale_s: float | None = None) -> bool:
        return self.age(now) < (self.stale_s if stale_s is None else stale_s)

    def is_mine(self, me: Identity, pid: int) -> bool:
        return origin(asdict(self), me) == HERE and self.pid == pid

    def describe(self, now: float) -> str:
        return f"host {self.host} (pid {self.pid}, lease renewed {self.age(now):.0f} s ago)"


def read_lease(run_dir: Path) -> Lease | None:
    """The run dir's lease, or ``None`` when there is none (or nothing trustworthy in it)."""
    try:
        data = json.loads((run_dir / LEASE_FILE).read_text(encoding="utf-8"))
        return Lease(str(data["host"]), str(data.get("boot_id") or ""), int(data["pid"]), float(data["renewed"]),
                     float(data.get("stale_s") or DEFAULT_STALE_S))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


class LeaseKeeper:
    """Writes and renews this supervisor's lease; ``tick`` is cheap when no renewal is due."""

    def __init__(self, run_dir: Path, me: Identity, stale_s: float, *, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.path = run_dir / LEASE_FILE
        self.me, self.stale_s, self.clock, self.wall = me, stale_s, clock, wall
        self.every_s = max(0.2, min(5.0, stale_s / 4))  # several renewals inside one window
        self._due = float("-inf")
        self.lost: Lease | None = None

    def write(self) -> None:
        lease = Lease(self.me.host, self.me.boot_id, os.getpid(), round(self.wall(), 3), self.stale_s)
        try:
            atomic_write_text(self.path, json.dumps(asdict(lease)) + "\n")
        except OSError:
            pass  # a full disk must not end supervision; the next renewal tries again
        self._due = self.clock() + self.every_s

    def tick(self) -> Lease | None:
        """Renew when due; the lease of another supervisor that took the run over meanwhile (this one
        was judged dead: suspended, or cut off from the storage), which it then never renews again."""
        if self.lost is not None or self.clock() < self._due:
            return None
        found = read_lease(self.path.parent)
        if found is not None and not found.is_mine(self.me, os.getpid()):
            self.lost = found
            return found
        self.write()
        return None

    def release(self) -> None:
        """At the run's end: remove the lease if it is still this supervisor's."""
        found = read_lease(self.path.parent)
        if found is not None and found.is_mine(self.me, os.getpid()):
            try:
                self.path.unlink()
            except OSError:
                pass
