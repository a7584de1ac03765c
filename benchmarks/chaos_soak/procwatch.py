"""Process sampling: a thread that samples the process table every 50 ms for the trainers on one
output dir (the demo's, or with `match` another trainer's, e.g. sd-scripts' train_network.py),
recording when each was seen alive and gone, and every moment two trainer trees ran at once
(invariant 4; 5 in the real mode)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil


@dataclass
class Seen:
    pid: int
    last_alive: float  # time.time() of the last sample that found it running
    gone: float | None = None  # of the first sample that did not


def demo_trainer(cmd: list[str], out: str) -> bool:
    """The demo trainer itself, not trainsup (whose argv holds the same command after `--`)."""
    return len(cmd) > 2 and cmd[1:3] == ["-m", "trainsup.demo.train_network"] and out in cmd


class ProcWatch(threading.Thread):
    """Samples the process table every 50 ms for trainers on one output dir (``match(argv, out)``)."""

    def __init__(self, out: Path, match: Callable[[list[str], str], bool] = demo_trainer) -> None:
        super().__init__(name="chaos-procwatch", daemon=True)
        self.out = str(out)
        self.match = match
        self.seen: dict[int, Seen] = {}
        self.overlaps: list[tuple[float, list[int]]] = []
        self.workers: set[int] = set()  # seen as a trainer's child once: a worker even when orphaned
        self.halt = threading.Event()

    def _trainers(self) -> list[psutil.Process]:
        found = []
        for proc in psutil.process_iter(["cmdline", "status"]):
            cmd = proc.info["cmdline"] or []
            if self.match(cmd, self.out) and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc)
        return found

    def sample(self) -> None:
        now = time.time()
        alive: dict[int, int] = {}
        for proc in self._trainers():
            try:
                alive[proc.pid] = proc.ppid()
            except psutil.Error:
                continue
        # DataLoader workers carry the trainer's argv: count only the top of each tree (a worker
        # its killed trainer left behind for a moment is still no trainer)
        self.workers.update(pid for pid, parent in alive.items() if parent in alive)
        roots = [pid for pid, parent in alive.items() if parent not in alive and pid not in self.workers]
        for pid in alive:
            s = self.seen.get(pid)
            if s is None or s.gone is not None:
                self.seen[pid] = Seen(pid, now)
            else:
                s.last_alive = now
        for s in self.seen.values():
            if s.gone is None and s.pid not in alive:
                s.gone = now
                self.workers.discard(s.pid)  # its pid may come back as another process
        if len(roots) > 1:
            self.overlaps.append((now, sorted(roots)))

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                self.sample()
            except psutil.Error:
                pass
            self.halt.wait(0.05)

    def alive(self) -> list[int]:
        return [s.pid for s in self.seen.values() if s.gone is None]
