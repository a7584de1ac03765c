"""Owns how an attempt ended: the exit status (with the real child's behind a launcher, as accelerate
or torchrun report it) and the fault id that ending gives, from the scanner's verdict."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .verdict import Evidence

STATUS_LINE = re.compile(r"returned non-zero exit status (-?\d+)")
SIGNAL_LINE = re.compile(r"died with <Signals\.SIG\w+: (\d+)>")
TORCHRUN_LINE = re.compile(r"^exitcode  +: (-?\d+)|\(exitcode: (-?\d+)\)")
# A process's own crash in native code (SIGILL, SIGBUS, SIGFPE, SIGSEGV): no Python traceback, and the
# other ranks' collectives fail after it. Not SIGABRT (NCCL's watchdog aborts its own rank on a timeout)
# nor SIGTERM or SIGINT (the launcher's teardown).
CRASH_SIGNALS = frozenset({4, 7, 8, 11})


@dataclass(frozen=True)
class ExitInfo:
    """How an attempt ended, including the real child's status behind accelerate."""

    exit_code: int | None
    signal: int | None
    child_status: int | None
    child_signal: int | None
    success_marker_seen: bool


def classify_exit(info: ExitInfo, verdict: Evidence | None) -> str | None:
    """The fault id of a finished attempt, or None for a clean finish.

    A run that exited 0 with its trainer's success marker (the adapter's) has finished, whatever
    it printed on the way; only a live fault (NaN loss) still counts.  Otherwise the
    trainer's exception and live evidence win; then a SIGKILL of the process or of the
    real child behind accelerate (which exits 1 and only prints the child's fate) means
    the host OOM killer, over any line printed before it; then other evidence; any other
    failure is ``unknown``.  Exit 0 is clean only with the success
    marker: a trainer may exit 0 having trained nothing (its adapter's success line says it finished).
    A collective's failure (``Evidence.consequence``: the other ranks' lost peer) gives way to the kill of a
    rank (the child behind the launcher): the killed rank is the cause (seen on TRL's two gloo ranks: rank
    0's traceback for the peer that a kill -9 took was printed before the rank watch stopped the group).
    Not to the launcher's own SIGKILL: Lightning's launching process kills its whole group itself once a
    rank failed (seen on LitGPT's two ranks: rank 1's collective timed out, exit 1, then the SIGKILL).
    A rank's crash (``CRASH_SIGNALS``: a segfault in native code) is a cause too: ``unknown``, restarted
    as it was, never the collective's remedy (a longer timeout would only wait longer for a dead rank).
    """
    if exited_cleanly(info):
        return verdict.fault if verdict is not None and verdict.live else None
    rank_killed = info.child_signal == 9 or info.child_status in (137, -9)
    killed = info.signal == 9 or info.exit_code in (137, -9) or rank_killed
    if verdict is not None and verdict.consequence and not verdict.live and not killed and rank_crashed(info):
        return "unknown"  # the rank's crash (no rule names one) is the cause, the collective its consequence
    if verdict is not None and (verdict.live or not killed
                                or (verdict.anchored and not (verdict.consequence and rank_killed))):
        return verdict.fault
    if killed:
        return "host_oom_killed"  # the kill ended the run, whatever was printed before it
    return "unknown"  # any other failure, or exit 0 without the success marker


def rank_crashed(info: ExitInfo) -> bool:
    """Whether the real child behind a launcher (a rank) died of a crash signal (``CRASH_SIGNALS``)."""
    return info.child_signal in CRASH_SIGNALS or (info.child_status is not None and (
        -info.child_status in CRASH_SIGNALS or info.child_status - 128 in CRASH_SIGNALS))


def exited_cleanly(info: ExitInfo) -> bool:
    """Exit 0 (and a clean child behind the launcher, if it said) with the success marker."""
    return (info.success_marker_seen and info.signal is None and info.exit_code == 0
            and info.child_signal is None and info.child_status in (None, 0))


def parse_child_status(clean_line: str) -> tuple[int | None, int | None] | None:
    """``(status, signal)`` of the child as accelerate or torchrun report it, else None."""
    m = STATUS_LINE.search(clean_line)
    if m is not None:
        return int(m.group(1)), None
    m = SIGNAL_LINE.search(clean_line)
    if m is not None:
        return None, int(m.group(1))
    m = TORCHRUN_LINE.search(clean_line)
    if m is not None:
        code = int(m.group(1) or m.group(2))
        return (None, -code) if code < 0 else (code, None)
    return None
