"""Owns the events of the decision loop: what the threads (and the loop itself) tell it, one type each.

Threads only produce: the pumps' parser (``run.observe``) posts what the trainer's output showed,
the file watcher an edit, the GPU sampler a reading, the signal handler a stop request; the engine
posts its own planned stops. Every event is a frozen dataclass put on one ``queue.SimpleQueue``:
its ``put`` is reentrant, so a signal handler may post while the main thread is inside ``get``
(``queue.Queue`` takes a lock there, and a handler taking it again would deadlock: bpo-14976).
The loop dispatches on the type (``match``), never on a string.
"""

from __future__ import annotations

import queue
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    from ..faults.matchers import Progress
    from ..faults.verdict import Evidence
    from ..sensors.ranks import RankEnd

__all__ = [
    "Eof",
    "Event",
    "EventQueue",
    "EvidenceSeen",
    "FileChanged",
    "GpuSampled",
    "PhaseEntered",
    "ProgressSeen",
    "RankEnded",
    "RanksFound",
    "RunComplete",
    "StateDone",
    "StopForChange",
    "StopRequested",
    "SummarySeen",
    "new_queue",
    "next_event",
]


@dataclass(frozen=True)
class Eof:
    """One of the child's pipes reached its end (``stdout`` or ``stderr``)."""

    stream: str


@dataclass(frozen=True)
class StopRequested:
    """The run must stop for ``signum`` (SIGTERM, SIGINT, the deadline's signal); the trainer is sent
    ``trainer_signal`` (a save signal at a deadline)."""

    signum: int
    trainer_signal: int = signal.SIGTERM


@dataclass(frozen=True)
class ProgressSeen:
    """The trainer's progress bar, parsed (the step as the trainer printed it)."""

    progress: Progress


@dataclass(frozen=True)
class PhaseEntered:
    """The trainer entered a phase the hang clock times apart (sampling, saving, back to training)."""

    phase: str
    line: str


@dataclass(frozen=True)
class SummarySeen:
    """The trainer's start-up summary is complete (its values are in the attempt's observations)."""


@dataclass(frozen=True)
class StateDone:
    """A state's last file was announced; ``path`` is where (``None``: look at every state on disk)."""

    path: str | None


@dataclass(frozen=True)
class EvidenceSeen:
    """A line that is evidence for a fault, as a rule matched it."""

    evidence: Evidence


@dataclass(frozen=True)
class FileChanged:
    """A watched input was saved (debounced: one per save)."""

    path: Path
    kind: str


@dataclass(frozen=True)
class GpuSampled:
    """One reading of the GPUs the trainer uses (``sensors.gpuwatch.DeviceSample`` each)."""

    samples: list[Any]


@dataclass(frozen=True)
class StopForChange:
    """The engine's planned stop: a checkpoint is complete and an edit is to be applied (or the adapter
    asked for a relaunch there)."""


@dataclass(frozen=True)
class RunComplete:
    """The engine's planned stop: the last step's state is complete, the run is done."""


@dataclass(frozen=True)
class RanksFound:
    """The attempt found its training processes under the launcher (``sensors.ranks``): rank and pid each."""

    ranks: tuple[dict[str, int | None], ...]


@dataclass(frozen=True)
class RankEnded:
    """One of them ended while the launcher still ran."""

    end: RankEnd


@dataclass(frozen=True)
class RanksStuckAtExit:
    """The run said it finished and a rank exited cleanly, but these ranks had not exited ``waited_s``
    later: the attempt stops them and ends as finished."""

    pids: tuple[int, ...]
    waited_s: float


Event: TypeAlias = (Eof | StopRequested | ProgressSeen | PhaseEntered | SummarySeen | StateDone | EvidenceSeen
                    | FileChanged | GpuSampled | StopForChange | RunComplete | RanksFound | RankEnded
                    | RanksStuckAtExit)
EventQueue = queue.SimpleQueue[Event]


def new_queue() -> EventQueue:
    return queue.SimpleQueue()


def next_event(events: EventQueue, timeout: float) -> Event | None:
    """The next event, or ``None`` when none came within ``timeout`` seconds."""
    try:
        return events.get(timeout=timeout)
    except queue.Empty:
        return None
