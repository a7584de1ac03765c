"""Owns checking that a pid is still the trainsup supervisor it was, before ``stop`` (a run dir's
lock holder) or ``stop ID`` (a queue entry's supervisor) signals it.

A pid the kernel handed to a newer process after the supervisor's death fails the check: it was
created after the lock was taken, or its command line is not trainsup's.
"""

from __future__ import annotations

import psutil

from ..record.runlock import Holder

__all__ = ["check_supervisor"]

CREATE_SLACK_S = 2.0  # create_time and the lock's start time come from different clocks' roundings


def check_supervisor(sup: Holder) -> str | None:
    """Why ``sup.pid`` is not (any more) the supervisor that took the lock, or ``None`` when it is."""
    try:
        proc = psutil.Process(sup.pid)
        created = proc.create_time()
        cmdline = proc.cmdline()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return f"pid {sup.pid} has exited"
    except psutil.AccessDenied:
        return f"not allowed to inspect pid {sup.pid} (another user's run?)"
    if sup.started > 0 and created > sup.started + CREATE_SLACK_S:
        return (f"pid {sup.pid} was started after the lock was taken: it is another process now, "
                "not the supervisor; not signalling it")
    if not any("trainsup" in part for part in cmdline):
        shown = " ".join(" ".join(cmdline).split())[:120] or "?"  # one line, whatever its argv holds
        return f"pid {sup.pid} ({shown}) is not a trainsup process; not signalling it"
    return None
