"""Owns choosing which queued entries start now, and on which GPUs. Pure: no I/O, no clock.

The rules, in the order they apply:
- a paused queue starts nothing;
- entries are taken in queue order (priority, then position); an entry that cannot start now does
  not hold back the ones after it (a small job may run beside a big one waiting for two GPUs);
- an entry whose run dir is in use (another entry of the same project running, or someone's
  foreground ``trainsup run``) waits;
- at most ``slots`` entries run at once;
- with GPUs: an entry that names GPUs gets exactly those, once no other entry of this queue has them;
  one that names none gets the first GPU that no entry holds and that has at least ``min_free_bytes``
  free (other programs' memory counts against it);
- without GPUs (no driver, or none visible): only the slots decide.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..sensors.gpu import GpuDevice
from .queuestore import Entry, order_key


@dataclass(frozen=True)
class Start:
    entry: Entry
    gpus: list[str] | None  # what CUDA_VISIBLE_DEVICES gets; None: leave it as the project says


def plan_starts(entries: Sequence[Entry], *, slots: int, paused: bool, devices: Sequence[GpuDevice] | None,
                busy_run_dirs: Iterable[str] = (), min_free_bytes: int = 0) -> list[Start]:
    if paused:
        return []
    running = [e for e in entries if e.state == "running"]
    free_slots = slots - len(running)
    busy = set(busy_run_dirs) | {e.run_dir for e in running}
    held = {g for e in running for g in (e.assigned_gpus or e.gpus or [])}
    starts: list[Start] = []
    for entry in sorted((e for e in entries if e.state == "queued"), key=order_key):
        if free_slots <= 0:
            break
        if entry.run_dir in busy:
            continue
        fits, gpus = _gpus_for(entry, devices, held, min_free_bytes)
        if not fits:
            continue
        starts.append(Start(entry, gpus))
        free_slots -= 1
        busy.add(entry.run_dir)
        held.update(gpus or [])
    return starts


def _gpus_for(entry: Entry, devices: Sequence[GpuDevice] | None, held: set[str],
              min_free_bytes: int) -> tuple[bool, list[str] | None]:
    """Whether the entry can start now, and its GPUs (``None`` when GPUs do not decide)."""
    if entry.gpus:
        return (False, None) if held & set(entry.gpus) else (True, list(entry.gpus))
    if not devices:
        return True, None
    for device in devices:
        key = str(device.index)
        if key in held or (device.uuid is not None and device.uuid in held):
            continue
        if device.free_bytes is not None and device.free_bytes < min_free_bytes:
            continue  # another program holds too much of it
        return True, [key]
    return False, None
