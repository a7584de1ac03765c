"""Owns finding a run's training processes under its launcher (its ranks), and noticing one's end.

A launcher (``torchrun``, ``accelerate launch``, ``deepspeed``, Lightning's own) starts the processes
that train and waits on them; trainsup's child is the launcher. When a rank dies, the others may block
in a collective until its timeout (minutes), and even a one-process launcher takes seconds to notice its
child's end and exit (seen on an H100: 3.6 of the 4.17 s from a kill to the relaunch). So the attempt
watches the ranks themselves.

A rank is a descendant whose environment (``/proc/PID/environ``, as it was started) has ``RANK``, else
``LOCAL_RANK``, and whose parent has another or none: a data-loader worker inherits its rank's
environment and is not a rank. Lightning's launcher starts ranks 1.. with ``LOCAL_RANK`` and is rank 0
itself. Under a one-process launcher no process has a rank: the launcher's own children are the trainer
(rank ``None``). A rank's end is read from ``/proc/PID/stat``: gone, or a zombie whose exit status
(field 52, as ``waitpid`` reports it) says how it ended until its parent reaps it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

# Launchers by program name, or by the module ``python -m`` runs. TRL's and axolotl's command lines start
# their training through accelerate's launcher, in a child process. Only true launchers: under one, the
# direct Python children are the trainers (a trainer's own children are its data-loader workers).
LAUNCHER_PROGRAMS = frozenset({"torchrun", "accelerate", "deepspeed", "lightning", "trl", "axolotl"})
LAUNCHER_MODULES = frozenset({"torch.distributed.run", "torch.distributed.launch", "accelerate.commands.launch",
                              "accelerate.commands.accelerate_cli", "deepspeed.launcher.runner"})
RANK_VARS = ("RANK", "LOCAL_RANK")


def is_launcher(argv: Sequence[str]) -> bool:
    """Whether a command starts its training through a launcher of ranks."""
    if not argv:
        return False
    if os.path.basename(argv[0]) in LAUNCHER_PROGRAMS:
        return True
    return any(a == "-m" and i + 1 < len(argv) and argv[i + 1] in LAUNCHER_MODULES for i, a in enumerate(argv[:3]))


@dataclass(frozen=True)
class Rank:
    pid: int
    rank: int | None  # None: the one trainer under a one-process launcher
    started: float  # its create time: a pid used again by another process is not this rank

    def record(self) -> dict[str, int | None]:
        return {"rank": self.rank, "pid": self.pid}


@dataclass(frozen=True)
class RankEnd:
    rank: Rank
    exit_code: int | None
    signal: int | None  # both None: reaped by its launcher before its status could be read

    @property
    def failed(self) -> bool | None:
        """True: it died or exited non-zero; False: it exited 0; None: not known."""
        if self.signal is not None:
            return True
        return None if self.exit_code is None else self.exit_code != 0

    def says(self) -> str:
        who = "the trainer" if self.rank.rank is None else f"rank {self.rank.rank}"
        if self.signal is not None:
            try:
                name = signal.Signals(self.signal).name
            except ValueError:
                name = f"signal {self.signal}"
            how = f"was killed by {name}"
        elif self.exit_code is not None:
            how = f"exited with {self.exit_code}"
        else:
            how = "ended"
        return f"{who} (pid {self.rank.pid}) {how}"


def _rank_of(proc: psutil.Process) -> int | None:
    try:
        env = proc.environ()
    except (psutil.Error, OSError):
        return None
    for var in RANK_VARS:
        value = env.get(var, "")
        if value.isdigit():
            return int(value)
    return None


def _exec_done(proc: psutil.Process) -> bool:
    """Whether ``proc`` runs a program of its own (its command line is not its parent's): its environment
    is then the one it was started with for good. Between a launcher's fork and the exec of a rank, the
    child still shows the launcher's (seen under load: a rank read then would be no rank for good)."""
    try:
        parent = proc.parent()
        return parent is None or proc.cmdline() != parent.cmdline()
    except (psutil.Error, OSError):
        return False


def find_ranks(root: int, launcher: bool, seen: dict[tuple[int, float], int | None] | None = None) -> list[Rank]:
    """The rank processes under ``root`` (trainsup's child), by rank; [] when ``root`` is itself the
    only trainer. ``seen``: each process's rank as read before (by pid and start time: a process's
    environment is set when it starts), so that a rescan reads the environment of new processes only
    (a node of 8 ranks with 8 data-loader workers each is 72 processes, rescanned every second)."""
    try:
        top = psutil.Process(root)
        procs = top.children(recursive=True)
    except psutil.Error:
        return []
    ranks: dict[int, int | None] = {}
    live: set[tuple[int, float]] = set()
    for proc in procs:
        if seen is None:
            ranks[proc.pid] = _rank_of(proc)
            continue
        try:
            key = (proc.pid, proc.create_time())
        except psutil.Error:
            continue
        live.add(key)
        if key in seen:
            ranks[proc.pid] = seen[key]
            continue
        final = _exec_done(proc)  # asked first: an environment read after it is the one the program started with
        ranks[proc.pid] = rank = _rank_of(proc)
        if rank is not None or final:
            seen[key] = rank  # (a child forked but not yet exec'd holds its launcher's environment, no rank)
    if seen is not None and len(seen) > 2 * len(live) + 64:
        for key in [k for k in seen if k not in live]:
            del seen[key]  # processes gone (data-loader workers come and go each epoch)
    found: list[Rank] = []
    for proc in procs:
        rank = ranks.get(proc.pid)
        if rank is None:
            continue
        try:
            parent, started = proc.ppid(), proc.create_time()
        except psutil.Error:
            continue
        if parent in ranks and ranks[parent] is not None:
            continue  # a worker of a rank (its environment inherited)
        found.append(Rank(proc.pid, rank, started))
    if found and not launcher and all(r.rank != 0 for r in found):
        try:
            found.append(Rank(root, 0, top.create_time()))  # Lightning: the launching process is rank 0
        except psutil.Error:
            pass
    if not found and launcher:
        for proc in procs:
            try:
                if proc.ppid() == root and "python" in os.path.basename(proc.exe() or proc.name()):
                    found.append(Rank(proc.pid, None, proc.create_time()))
            except (psutil.Error, OSError):
                continue
    return sorted(found, key=lambda r: (r.rank is None, r.rank or 0, r.pid))


def _stat(pid: int) -> tuple[str, float, int] | None:
    """``(state, start ticks, exit status)`` from ``/proc/PID/stat``; None when the process is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()  # after the command name, which may hold spaces
    try:
        return fields[0], float(fields[19]), int(fields[49])  # state (3), starttime (22), exit_code (52)
    except (IndexError, ValueError):
        return None


_TICKS = os.sysconf("SC_CLK_TCK")


def _boot_time() -> float:
    return float(psutil.boot_time())


class RankWatch:
    """The ranks under one launch, found again every ``rescan_s`` (they start after the launcher),
    and the ones that ended since the last ``poll``."""

    def __init__(self, root: int, launcher: bool, rescan_s: float = 1.0) -> None:
        self.root, self.launcher, self.rescan_s = root, launcher, rescan_s
        self.known: dict[int, Rank] = {}  # watched for their end (the launching process is the attempt's)
        self.root_rank: Rank | None = None
        self.ended: list[RankEnd] = []
        self._scanned: float | None = None
        self._boot = _boot_time()
        self._seen: dict[tuple[int, float], int | None] = {}  # each process's rank, read once

    @property
    def ranks(self) -> list[Rank]:
        """Every rank found, the launching process too where it is rank 0 (Lightning)."""
        found = [*self.known.values(), *((self.root_rank,) if self.root_rank is not None else ())]
        return sorted(found, key=lambda r: (r.rank is None, r.rank or 0, r.pid))

    def poll(self, now: float) -> tuple[list[RankEnd], bool]:
        """The ranks that ended since the last poll, and whether the set of ranks changed (found)."""
        changed = False
        if self._scanned is None or now - self._scanned >= self.rescan_s:
            self._scanned = now
            for rank in find_ranks(self.root, self.launcher, self._seen):
                if rank.pid == self.root:
                    changed, self.root_rank = changed or self.root_rank is None, rank
                elif (rank.pid not in self.known or self.known[rank.pid].rank != rank.rank) \
                        and not any(e.rank.pid == rank.pid for e in self.ended):
                    self.known[rank.pid] = rank  # new, or its number read now (found as a lone trainer first)
                    changed = True
            if any(r.rank is not None for r in self.known.values()):
                for pid in [pid for pid, r in self.known.items() if r.rank is None]:
                    del self.known[pid]  # the guess of a one-process launch: numbered ranks showed up since
                    changed = True
        ends = []
        for pid, rank in list(self.known.items()):
            stat = _stat(pid)
            started = self._boot + stat[1] / _TICKS if stat is not None else None
            if stat is not None and stat[0] != "Z" and started is not None and abs(started - rank.started) < 1.0:
                continue
            del self.known[pid]
            status = stat[2] if stat is not None and stat[0] == "Z" else None
            end = RankEnd(rank, *_decode(status))
            self.ended.append(end)
            ends.append(end)
        return sorted(ends, key=_first_cause), changed


def _first_cause(end: RankEnd) -> int:
    """Of the ranks that ended together, the one most likely to have ended the others first: killed by a
    signal of its own, then failed, then not known, then stopped (SIGTERM/SIGINT: what a launcher sends
    the rest when one died), then exited 0."""
    if end.signal is not None:
        return 3 if end.signal in (signal.SIGTERM, signal.SIGINT) else 0
    if end.exit_code is None:
        return 2
    return 1 if end.exit_code != 0 else 4


def _decode(status: int | None) -> tuple[int | None, int | None]:
    """A ``waitpid`` status as (exit code, signal)."""
    if status is None:
        return None, None
    if status & 0x7F:
        return None, status & 0x7F
    return (status >> 8) & 0xFF, None
