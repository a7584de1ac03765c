"""Faults a CPU-only demo cannot produce for real, raised only when explicitly asked for.

Owns the `TRAINSUP_DEMO_SIMULATE` switch (a comma list of `device_mismatch`,
`cuda_oom@STEP` and `hang@STEP`) and the pacing knobs `TRAINSUP_DEMO_STEP_SECONDS`
(a sleep after every optimizer step so tests can act while a run is in progress),
`TRAINSUP_DEMO_SAMPLE_SECONDS` (seconds per sampled image, spread over its
denoising steps, as a slow GPU would take) and `TRAINSUP_DEMO_SAVE_SECONDS`
(seconds a state save takes, spent in equal parts between writing its files, as
a slow disk would: a kill can then land mid-save and leave a state dir without
its last file). A simulated exception first says on
stderr that it is simulated, then raises with the wording torch itself uses; a
simulated hang says nothing at all, as a real one does: it blocks in
`hang_forever` until it is killed.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ENV_SIMULATE = "TRAINSUP_DEMO_SIMULATE"
ENV_STEP_SECONDS = "TRAINSUP_DEMO_STEP_SECONDS"
ENV_SAMPLE_SECONDS = "TRAINSUP_DEMO_SAMPLE_SECONDS"
ENV_SAVE_SECONDS = "TRAINSUP_DEMO_SAVE_SECONDS"

DEVICE_MISMATCH_MESSAGE = ("Expected all tensors to be on the same device, "
                           "but found at least two devices, cuda:0 and cpu!")
# torch >= 2.4 wording (torch.OutOfMemoryError, expandable_segments hint). Fragmented on purpose: the
# memory reserved but unallocated with the free memory would hold the request, so the OOM ladder's
# first rung (the allocator setting) is worth an attempt, as the demo shows it.
CUDA_OOM_MESSAGE = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.68 GiB of which "
    "1.05 GiB is free. Including non-PyTorch memory, this process has 22.61 GiB memory in use. Of the "
    "allocated memory 20.20 GiB is allocated by PyTorch, and 2.41 GiB is reserved by PyTorch but "
    "unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
    "Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)


@dataclass
class Simulation:
    device_mismatch: bool = False
    oom_steps: set[int] = field(default_factory=set)
    hang_steps: set[int] = field(default_factory=set)
    step_seconds: float = 0.0
    sample_seconds: float = 0.0  # per sampled image
    save_seconds: float = 0.0  # per state save, between its files
    once_dir: Path | None = None  # where a simulated hang leaves its mark: it hangs once per output dir


def from_env() -> Simulation:
    sim = Simulation()
    for raw in os.environ.get(ENV_SIMULATE, "").split(","):
        item = raw.strip()
        if not item:
            continue
        name, _, step = item.partition("@")
        if name == "device_mismatch":
            sim.device_mismatch = True
        elif name in ("cuda_oom", "hang") and step.isdigit():
            (sim.oom_steps if name == "cuda_oom" else sim.hang_steps).add(int(step))
        else:
            # a typo must not silently run a clean training that a test then misreads
            raise ValueError(f"{ENV_SIMULATE}: unknown item {item!r} (device_mismatch, cuda_oom@N, hang@N)")
    seconds = os.environ.get(ENV_STEP_SECONDS, "").strip()
    sim.step_seconds = float(seconds) if seconds else 0.0
    seconds = os.environ.get(ENV_SAMPLE_SECONDS, "").strip()
    sim.sample_seconds = float(seconds) if seconds else 0.0
    seconds = os.environ.get(ENV_SAVE_SECONDS, "").strip()
    sim.save_seconds = float(seconds) if seconds else 0.0
    return sim


def _announce(what: str) -> None:
    sys.stderr.write(f"[demo] SIMULATED {what}: a CPU-only machine cannot produce it; "
                     "raising the message torch prints\n")
    sys.stderr.flush()


def at_sampling(sim: Simulation, latents_cached: bool) -> None:
    """A device mismatch in sampling, seen in real runs with cached latents."""
    if sim.device_mismatch and latents_cached:
        _announce("device_mismatch")
        raise RuntimeError(DEVICE_MISMATCH_MESSAGE)


def at_step(sim: Simulation, step: int, gradient_checkpointing: bool) -> None:
    """Called while computing the step that will be numbered `step`."""
    if step in sim.oom_steps and not gradient_checkpointing:
        _announce("cuda_oom")
        import torch  # only now: keeps this module importable without torch

        raise torch.OutOfMemoryError(CUDA_OOM_MESSAGE)
    if step in sim.hang_steps:
        # A transient hang (a stuck collective, a DataLoader deadlock): the run after a restart goes on.
        mark = sim.once_dir / f".trainsup-demo-hang-{step}" if sim.once_dir is not None else None
        if mark is None or not mark.exists():
            if mark is not None:
                mark.parent.mkdir(parents=True, exist_ok=True)
                mark.touch()
            hang_forever()


def hang_forever() -> None:
    """A silent hang, as a deadlocked DataLoader or a stuck collective is: no output, no exit."""
    while True:
        time.sleep(3600)


def pace(sim: Simulation) -> None:
    if sim.step_seconds > 0:
        time.sleep(sim.step_seconds)


def pace_save(sim: Simulation, gaps: int) -> None:
    """One of the ``gaps`` pauses between the files of a state save, when saving is paced."""
    if sim.save_seconds > 0:
        time.sleep(sim.save_seconds / max(gaps, 1))


def pace_denoise(sim: Simulation, steps: int) -> None:
    """One denoising step of a sampled image, when sampling is paced."""
    if sim.sample_seconds > 0:
        time.sleep(sim.sample_seconds / max(steps, 1))
