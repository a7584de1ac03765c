"""Faults a CPU-only demo cannot produce for real, raised only when explicitly asked for.

Owns the `TRAINSUP_DEMO_SIMULATE` switch (a comma list of `device_mismatch`,
`cuda_oom@STEP` and `hang@STEP`) and the `TRAINSUP_DEMO_STEP_SECONDS` pacing
knob (a sleep after every optimizer step so tests can act while a run is in
progress). Every simulated fault first says on stderr that it is simulated,
then raises the exception with the wording torch itself uses.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field

ENV_SIMULATE = "TRAINSUP_DEMO_SIMULATE"
ENV_STEP_SECONDS = "TRAINSUP_DEMO_STEP_SECONDS"

DEVICE_MISMATCH_MESSAGE = "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"
# torch >= 2.4 wording (torch.OutOfMemoryError, expandable_segments hint)
CUDA_OOM_MESSAGE = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.68 GiB of which "
    "1.05 GiB is free. Including non-PyTorch memory, this process has 22.61 GiB memory in use. Of the "
    "allocated memory 21.40 GiB is allocated by PyTorch, and 812.00 MiB is reserved by PyTorch but "
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
    return sim


def _announce(what: str) -> None:
    sys.stderr.write(f"[demo] SIMULATED {what}: a CPU-only machine cannot produce it; raising the message torch prints\n")
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
        sys.stderr.write(f"[demo] SIMULATED hang at step {step}: sleeping until killed\n")
        sys.stderr.flush()
        while True:
            time.sleep(3600)


def pace(sim: Simulation) -> None:
    if sim.step_seconds > 0:
        time.sleep(sim.step_seconds)
