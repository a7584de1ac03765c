"""Owns claiming a run dir for this supervisor: the local lock, the lease that other hosts see, and
refusing a run dir that a live supervisor on another host owns.

Order matters on shared storage: the lease is read first (a ``flock`` taken here may not exclude a
supervisor on another host), then the lock is taken, then the lease is read again under the lock
(another host may have claimed it meanwhile) and written as ours. A live lease of another host
refuses the run; so does a lock held here. A lease left behind is taken over, journaled
(``lease_taken_over`` with the old host, pid, boot id and age): one from another host once older than
``lease.stale_s``; one from this host at once, since the lock was free (its supervisor is dead).
Two hosts taking the same stale lease at once: each writes its lease (atomically: the last rename
wins) and, after ``SETTLE_S``, reads it back; the one that finds the other's refuses before it
launches anything. A supervisor that finds its lease taken over while it runs was judged dead (suspended, cut off
from the storage): it stops its trainer and ends, never two trainers on one output dir.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from ..record import journalkinds as kinds
from ..record.journal import Journal
from ..record.lease import HERE, OTHER_HOST, Identity, Lease, LeaseKeeper, local_identity, origin, read_lease
from ..record.runlock import LockHeld, RunLock, holder

SETTLE_S = 0.3  # after taking another host's lease over: long enough for a racing host's write to land


class Refused(RuntimeError):
    """The run dir is another supervisor's: the message is the one ``trainsup: error:`` line."""


@dataclass
class Ownership:
    me: Identity
    lock: RunLock
    lease: LeaseKeeper
    replaced: Lease | None  # a dead supervisor's lease that this one took over
    replaced_age_s: float = 0.0

    def journal_takeover(self, journal: Journal, say: Callable[[str], None]) -> None:
        old = self.replaced
        if old is None:
            return
        where = origin(asdict(old), self.me)
        why = {OTHER_HOST: f"not renewed for {self.replaced_age_s:.0f} s (lease.stale_s {self.lease.stale_s:g})",
               HERE: "its supervisor is dead (the lock was free)"}.get(where, "this host rebooted since")
        journal.event(kinds.LEASE_TAKEN_OVER, host=old.host, boot_id=old.boot_id, pid=old.pid,
                      age_s=round(self.replaced_age_s, 3), origin=where, reason=why)
        say(f"taking the run over from the supervisor on host {old.host} (pid {old.pid}): {why}")

    def tick(self, say: Callable[[str], None], stop: Callable[[int], None]) -> None:
        """Renew the lease when due; stop the run when another supervisor has taken it over."""
        other = self.lease.tick()
        if other is not None:
            say(f"error: the run was taken over by {other.describe(time.time())}: this supervisor was judged "
                "dead; stopping its trainer")
            stop(signal.SIGTERM)

    def release(self) -> None:
        self.lease.release()
        self.lock.release()


def _refusal(run_dir: Path, lease: Lease, stale_s: float) -> Refused:
    return Refused(f"{run_dir} is owned by a live trainsup on {lease.describe(time.time())}; "
                   f"it counts as dead once its lease is {stale_s:g} s old (lease.stale_s)")


def _foreign_live(lease: Lease | None, me: Identity, stale_s: float) -> bool:
    return lease is not None and origin(asdict(lease), me) == OTHER_HOST and lease.live(time.time(), stale_s)


def claim(run_dir: Path, stale_s: float, me: Identity | None = None) -> Ownership:
    """Make this supervisor the run dir's owner, or raise ``Refused``; ``OSError`` when the run dir
    cannot be used."""
    me = me or local_identity()
    before = read_lease(run_dir)
    if _foreign_live(before, me, stale_s):
        assert before is not None
        raise _refusal(run_dir, before, stale_s)
    lock = RunLock(run_dir)
    try:
        lock.acquire()
    except LockHeld:
        sup = holder(run_dir)
        named = f" (pid {sup.pid}{f' on host {sup.host}' if sup.host else ''})" if sup and sup.pid else ""
        raise Refused(f"another trainsup run holds {run_dir}{named}") from None
    keeper = LeaseKeeper(run_dir, me, stale_s)
    now = read_lease(run_dir)
    if _foreign_live(now, me, stale_s):  # another host claimed it between the two reads
        lock.release()
        assert now is not None
        raise _refusal(run_dir, now, stale_s)
    replaced = now if now is not None and not now.is_mine(me, os.getpid()) else None
    keeper.write()
    if replaced is not None and origin(asdict(replaced), me) == OTHER_HOST:
        time.sleep(SETTLE_S)
        after = read_lease(run_dir)
        if after is not None and not after.is_mine(me, os.getpid()):  # a racing host's write landed last
            lock.release()
            raise _refusal(run_dir, after, stale_s)
    return Ownership(me, lock, keeper, replaced, replaced.age(time.time()) if replaced else 0.0)
