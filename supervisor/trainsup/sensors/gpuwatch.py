"""Owns watching the trainer's GPUs while it runs: which devices are its, who holds their memory.

``visible_devices`` reads ``CUDA_VISIBLE_DEVICES`` the way CUDA does (indices or UUIDs, a list cut
short at the first entry that names no device). ``take_sample`` turns one probe reading into a
``DeviceSample`` per device: used and total memory, the share held by the trainer's process tree
(found with psutil) and the processes outside it. ``GpuSampler`` is a producer thread like the
output pumps: every ``poll_s`` it hands ``[DeviceSample, ...]`` to ``on_samples`` (the engine puts
it on its event queue) and keeps the attempt's peaks and every pid of the tree that held memory (the
memory a relaunch waits for).

Memory is in MiB. A value the probe cannot give stays ``None`` ("unknown"), never 0.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

from .gpu import GpuDevice, GpuProbe

MIB = 1 << 20


@dataclass(frozen=True)
class GpuPolicy:
    poll_s: float = 2.0  # how often the sampler and the waits below read NVML
    reclaim_tolerance_mib: float = 512.0  # a relaunch waits until used memory is this close to the baseline
    reclaim_timeout_s: float = 60.0  # ... or this long, then launches anyway with a warning
    foreign_warn_mib: float = 1024.0  # another program holding this much on the trainer's GPUs is reported
    on_foreign: str = "warn"  # warn | wait (up to reclaim_timeout_s) before a launch


@dataclass(frozen=True)
class ForeignProcess:
    pid: int
    name: str | None
    mib: int | None


@dataclass(frozen=True)
class DeviceSample:
    index: int
    uuid: str | None
    name: str
    used_mib: int | None
    total_mib: int | None
    trainer_mib: int | None  # None: the per-process figures are unknown
    others: tuple[ForeignProcess, ...] | None  # processes outside the trainer's tree; None: unknown
    utilization_pct: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None

    @property
    def foreign_mib(self) -> int | None:
        if self.others is None or any(p.mib is None for p in self.others):
            return None
        return sum(p.mib or 0 for p in self.others)

    def status(self) -> dict[str, Any]:
        """This device's entry in ``status.json``."""
        return {"index": self.index, "name": self.name, "used_mib": self.used_mib, "total_mib": self.total_mib,
                "trainer_mib": self.trainer_mib, "utilization_pct": self.utilization_pct,
                "temperature_c": self.temperature_c, "power_w": self.power_w}


def _mib(value: int | None) -> int | None:
    return None if value is None else round(value / MIB)


def visible_devices(devices: list[GpuDevice], cuda_visible: str | None) -> list[GpuDevice]:
    """The devices a process started with this ``CUDA_VISIBLE_DEVICES`` may use, in its order.

    Unset: all. An entry is an index or a UUID (or a unique prefix of one, with or without ``GPU-``);
    CUDA ignores the rest of the list from the first entry that names no device, and so do we.
    """
    if cuda_visible is None:
        return list(devices)
    chosen: list[GpuDevice] = []
    for raw in cuda_visible.split(","):
        token = raw.strip()
        if token.lstrip("-").isdigit():
            found = [d for d in devices if d.index == int(token)]
        else:
            prefix = token if token.upper().startswith(("GPU-", "MIG-")) else f"GPU-{token}"
            found = [d for d in devices if token and d.uuid and d.uuid.lower().startswith(prefix.lower())]
        if len(found) != 1 or found[0] in chosen:
            break
        chosen.append(found[0])
    return chosen


def tree_pids(root_pid: int) -> set[int]:
    """The root and every live descendant."""
    try:
        root = psutil.Process(root_pid)
        return {root_pid} | {p.pid for p in root.children(recursive=True)}
    except psutil.Error:
        return set()


def take_sample(devices: list[GpuDevice], trainer: set[int]) -> list[DeviceSample]:
    """One reading of ``devices`` split into the trainer's share (``trainer`` pids) and the others'."""
    out = []
    for d in devices:
        trainer_mib: int | None = None
        others: tuple[ForeignProcess, ...] | None = None
        if d.processes is not None:
            own = [p for p in d.processes if p.pid in trainer]
            others = tuple(ForeignProcess(p.pid, p.name, _mib(p.used_bytes)) for p in d.processes
                           if p.pid not in trainer)
            if all(p.used_bytes is not None for p in own):
                trainer_mib = sum(_mib(p.used_bytes) or 0 for p in own)
        out.append(DeviceSample(d.index, d.uuid, d.name, _mib(d.used_bytes), _mib(d.total_bytes), trainer_mib,
                                others, d.utilization_pct, d.temperature_c, d.power_w))
    return out


@dataclass
class Peaks:
    """The highest readings of one attempt, per device index."""
    used_mib: dict[int, int] = field(default_factory=dict)
    trainer_mib: dict[int, int] = field(default_factory=dict)
    total_mib: dict[int, int | None] = field(default_factory=dict)

    def add(self, samples: list[DeviceSample]) -> None:
        for s in samples:
            self.total_mib[s.index] = s.total_mib
            if s.used_mib is not None:
                self.used_mib[s.index] = max(self.used_mib.get(s.index, 0), s.used_mib)
            if s.trainer_mib is not None:
                self.trainer_mib[s.index] = max(self.trainer_mib.get(s.index, 0), s.trainer_mib)

    def report(self) -> list[dict[str, Any]]:
        """Per device: the peak used memory, the peak held by the trainer, the total (``None``: unknown)."""
        return [{"index": i, "peak_used_mib": self.used_mib.get(i), "peak_trainer_mib": self.trainer_mib.get(i),
                 "total_mib": total} for i, total in sorted(self.total_mib.items())]


class GpuSampler(threading.Thread):
    """Reads the probe every ``poll_s`` while one attempt runs; ``stop()`` ends it and keeps the peaks."""

    def __init__(self, probe: GpuProbe, select: Callable[[list[GpuDevice]], list[GpuDevice]], root_pid: int,
                 on_samples: Callable[[list[DeviceSample]], None], poll_s: float) -> None:
        super().__init__(name="trainsup-gpu", daemon=True)
        self._probe, self._select, self._root, self._poll_s = probe, select, root_pid, poll_s
        self._on_samples = on_samples
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self.peaks = Peaks()
        self.held_by_tree: set[int] = set()  # pids of the tree that held GPU memory at some sample
        self._tree: set[int] = set()  # every pid seen in the tree: a dead one may still be listed
        self.latest: list[DeviceSample] | None = None
        self.errors = 0

    def run(self) -> None:
        while not self._halt.is_set():
            self.sample_once()
            self._halt.wait(self._poll_s)

    def sample_once(self) -> list[DeviceSample] | None:
        self._tree |= tree_pids(self._root)
        tree = self._tree
        try:
            devices = self._select(self._probe.devices())
        except Exception:  # noqa: BLE001 - an NVML failure is one unknown reading, not the end of the run
            with self._lock:
                self.errors += 1
            return None
        samples = take_sample(devices, tree)
        holders = {p.pid for d in devices for p in d.processes or () if p.pid in tree}
        with self._lock:
            self.peaks.add(samples)
            self.held_by_tree |= holders
            self.latest = samples
        self._on_samples(samples)  # the loop hears of it (a typed event on its queue)
        return samples

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(timeout=5)
