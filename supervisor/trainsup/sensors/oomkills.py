"""Owns one fact about the kernel: how many processes its OOM killer has killed since boot.

Linux counts every OOM kill (system-wide and in memory cgroups) in ``/proc/vmstat``'s ``oom_kill``
(since 4.13; readable by anyone). A trainer killed by SIGKILL while that count stayed the same was
not killed for memory: a person, a script or a service manager did it, and a memory remedy (fewer
data-loader workers) would only change the training for nothing. Host-wide in a container: an OOM
kill elsewhere on the host counts too, which errs on the side of the remedy.
"""

from __future__ import annotations

from pathlib import Path

VMSTAT = Path("/proc/vmstat")
NOT_FOR_MEMORY = ("the trainer was killed, but the kernel's OOM killer killed nothing meanwhile "
                  "(/proc/vmstat oom_kill): restarting with the same settings")


def oom_kills(vmstat: Path = VMSTAT) -> int | None:
    """The kernel's OOM-kill count, or None where it cannot be read (then nothing is concluded)."""
    try:
        for line in vmstat.read_text(encoding="ascii", errors="replace").splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def killed_for_memory(before: int | None, after: int | None) -> bool | None:
    """Whether the OOM killer acted between two readings; None when either is unknown."""
    if before is None or after is None:
        return None
    return after > before
