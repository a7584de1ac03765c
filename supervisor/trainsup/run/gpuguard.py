"""Owns the run's use of the GPU sensors: the sampler per attempt, the waits before a relaunch.

Before the first launch the guard notes each device's used memory (the baseline). While an attempt
runs, a ``GpuSampler`` thread reports readings (status.json's ``gpu`` list) and peaks (the
``attempt_end`` event). Before every later launch it waits for the dead tree's memory to come back
(``gpu_reclaim``): no pid of the old tree still listed, and used memory within the tolerance of the
baseline, counting out what other programs took meanwhile; then it reports programs outside the
trainer that hold memory on its GPUs (``gpu_foreign``) and, when the policy says so, waits for them.

Without an NVIDIA driver the guard is inert: ``status.json`` says ``gpu: null``, one ``info``
event says why, no thread runs and no wait happens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..record import journalkinds as kinds
from ..record.journal import Journal
from ..sensors.gpu import GpuDevice, GpuProbe
from ..sensors.gpuwatch import DeviceSample, GpuPolicy, GpuSampler, take_sample, visible_devices
from . import process
from .events import EventQueue, GpuSampled

Wait = Callable[[float], bool]  # sleep this long; True when a stop request arrived meanwhile


class GpuGuard:
    def __init__(self, probe: GpuProbe, cuda_visible: str | None, policy: GpuPolicy, journal: Journal,
                 say: Callable[[str], None], clock: Callable[[], float], wait: Wait) -> None:
        self.probe, self.policy, self.journal, self.say, self.clock, self.wait = \
            probe, policy, journal, say, clock, wait
        self.cuda_visible = cuda_visible
        self.sampler: GpuSampler | None = None
        self.last: GpuSampler | None = None  # the ended attempt's sampler: its peaks and pids
        self.baseline: list[DeviceSample] | None = None
        if not probe.available:
            self.journal.event(kinds.INFO, message=f"GPU monitoring off: {probe.reason}")
            self.journal.status(gpu=None)
            self.say(f"GPU monitoring off: {probe.reason}")
            return
        self.baseline = self._read(set())
        self.journal.status(gpu=[s.status() for s in self.baseline or []])

    @property
    def on(self) -> bool:
        return self.probe.available

    def _select(self, devices: list[GpuDevice]) -> list[GpuDevice]:
        return visible_devices(devices, self.cuda_visible)

    def _read(self, trainer: set[int]) -> list[DeviceSample] | None:
        try:
            return take_sample(self._select(self.probe.devices()), trainer)
        except Exception:  # noqa: BLE001 - NVML failed this once: unknown
            return None

    # --- one attempt -----------------------------------------------------------------------------
    def attach(self, child: process.Child, events: EventQueue) -> process.Child:
        """Start sampling the tree of a freshly spawned trainer; each reading goes on ``events``."""
        if self.on:
            self.sampler = GpuSampler(self.probe, self._select, child.pid,
                                      lambda samples: events.put(GpuSampled(samples)), self.policy.poll_s)
            self.sampler.start()
        return child

    def attempt_ended(self) -> list[dict[str, Any]] | None:
        """Stop sampling; each device's peaks for ``attempt_end`` (``None`` without GPU monitoring)."""
        if self.sampler is None:
            return None
        self.sampler.stop()
        self.last, self.sampler = self.sampler, None
        return self.last.peaks.report()

    def status_entries(self, samples: list[DeviceSample]) -> list[dict[str, Any]]:
        """status.json's ``gpu`` list: each device's reading and this attempt's peak."""
        peaks = self.sampler.peaks.used_mib if self.sampler is not None else {}
        return [{**s.status(), "peak_mib": peaks.get(s.index)} for s in samples]

    def utilization(self) -> str | None:
        """The latest utilisation for a hang's evidence, e.g. ``GPU 0 at 0%``; ``None`` when unknown."""
        latest = self.sampler.latest if self.sampler is not None else None
        known = [f"GPU {s.index} at {s.utilization_pct}%" for s in latest or [] if s.utilization_pct is not None]
        return ", ".join(known) or None

    def oom_details(self) -> tuple[list[dict[str, Any]] | None, int]:
        """For an OOM's ``fault`` event: per device the attempt's peak, the total and the foreign share
        at the last reading; and the foreign MiB in all (0 when unknown)."""
        sampler = self.last
        if sampler is None or sampler.latest is None:
            return None, 0
        peaks = {p["index"]: p for p in sampler.peaks.report()}
        details = [{"index": s.index, "peak_used_mib": peaks.get(s.index, {}).get("peak_used_mib"),
                    "total_mib": s.total_mib, "foreign_mib": s.foreign_mib} for s in sampler.latest]
        return details, sum(s.foreign_mib or 0 for s in sampler.latest)

    # --- before a launch ---------------------------------------------------------------------------
    def before_launch(self, attempt: int, *, wait_foreign: bool = False) -> bool:
        """Reclaim after an earlier attempt, then the foreign check. True: a stop request came meanwhile."""
        if not self.on:
            return False
        if self.last is not None and self._reclaim(attempt):
            return True
        return self._foreign(attempt, wait_foreign or self.policy.on_foreign == "wait")

    def _reclaim(self, attempt: int) -> bool:
        dead = set(self.last.held_by_tree) if self.last is not None else set()
        started = self.clock()
        while True:
            now = self._read(set())
            left = self._still_held(now, dead)
            waited = self.clock() - started
            if not left or waited >= self.policy.reclaim_timeout_s:
                break
            if self.wait(min(self.policy.poll_s, self.policy.reclaim_timeout_s - waited)):
                return True
        reclaimed = not left
        self.journal.event(kinds.GPU_RECLAIM, attempt=attempt, waited_s=round(waited, 3), reclaimed=reclaimed,
                           still_held=left or None)
        if not reclaimed:
            self.say(f"warning: GPU memory of the last attempt not reclaimed after {waited:.0f} s "
                     f"({'; '.join(left)}); launching anyway")
        elif waited >= 1:
            self.say(f"GPU memory of the last attempt reclaimed after {waited:.1f} s")
        return False

    def _still_held(self, now: list[DeviceSample] | None, dead: set[int]) -> list[str]:
        """What keeps the last attempt's memory from counting as reclaimed (empty: nothing)."""
        if now is None:
            return []  # the probe failed: unknown, and a wait would not make it known
        base = {s.index: s for s in self.baseline or []}
        held = []
        for s in now:
            ghosts = [p.pid for p in s.others or () if p.pid in dead]
            if ghosts:
                held.append(f"GPU {s.index}: pid {', '.join(map(str, ghosts))} of the last attempt still listed")
                continue
            before = base.get(s.index)
            if s.used_mib is None or before is None or before.used_mib is None:
                continue
            # What other programs took since the baseline is theirs, not the dead trainer's.
            grown = (s.foreign_mib or 0) - (before.foreign_mib or 0) if s.foreign_mib is not None else 0
            excess = s.used_mib - before.used_mib - max(grown, 0)
            if excess > self.policy.reclaim_tolerance_mib:
                held.append(f"GPU {s.index}: {excess} MiB above its {before.used_mib} MiB before the first launch")
        return held

    def _foreign(self, attempt: int, wait: bool) -> bool:
        seen = self._big_foreign(self._read(set()))
        if not seen:
            return False
        limit = self.policy.reclaim_timeout_s
        self.say(f"{'' if wait else 'warning: '}other programs hold memory on the trainer's GPUs: "
                 f"{_describe(seen)}" + (f"; waiting up to {limit:g} s for them" if wait else ""))
        started, left = self.clock(), seen
        while wait and left and self.clock() - started < limit:
            if self.wait(min(self.policy.poll_s, limit - (self.clock() - started))):
                return True
            left = self._big_foreign(self._read(set()))
        waited = self.clock() - started
        self.journal.event(kinds.GPU_FOREIGN, attempt=attempt, processes=seen, waited_s=round(waited, 3),
                           still_there=left if wait else None)
        if wait:
            self.say(f"warning: after {waited:.0f} s other programs still hold memory on the trainer's GPUs; "
                     "launching anyway" if left else f"the other programs freed the GPUs after {waited:.1f} s")
        return False

    def _big_foreign(self, now: list[DeviceSample] | None) -> list[dict[str, Any]]:
        dead = self.last.held_by_tree if self.last is not None else set()  # reported by the reclaim
        found = []
        for s in now or []:
            for p in s.others or ():
                if p.pid not in dead and p.mib is not None and p.mib >= self.policy.foreign_warn_mib:
                    found.append({"gpu": s.index, "pid": p.pid, "name": p.name, "mib": p.mib})
        return found

    def stop(self) -> None:
        """The run ends: no more sampling, NVML let go."""
        if self.sampler is not None:
            self.sampler.stop()
        self.probe.close()


def _describe(procs: list[dict[str, Any]]) -> str:
    return ", ".join(f"pid {p['pid']} ({p['name'] or '?'}) {p['mib']} MiB on GPU {p['gpu']}" for p in procs)
