"""Owns what each fault class means to the engine, in one table: the engine reads these properties
and never special-cases a fault id.

- ``restartable``: False when a restart cannot fix it (the run stops at once with the diagnosis); a
  rule may say so too (``FaultRule.restartable``, a policy's ``restartable: false``).
- ``voids_save_in_progress``: a state save that was under way when the fault struck is broken (the
  serializer failed while writing it); the state store marks it failed.
- ``memory``: the memory it ran out of, ``"gpu"`` (the engine records the GPUs' use and other
  programs' memory, and may wait for them) or ``"host"`` (the engine asks whether the kernel's OOM
  killer killed anything meanwhile).
- ``repeats_at_same_spot``: a recurrence at the same spot (the same stacks of a hang) means the
  restart did not help: the run stops.
- ``repeats_at_same_step``: a recurrence at the same step when its ladder has no change left to make
  (only plain restarts) means the next restart meets the same wall: the run stops, saying
  ``same_step_reason``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from .rules import FaultRule

__all__ = ["FAULT_CLASSES", "FaultClass", "fault_class", "not_restartable"]


@dataclass(frozen=True)
class FaultClass:
    restartable: bool = True
    voids_save_in_progress: bool = False
    memory: Literal["gpu", "host"] | None = None
    repeats_at_same_spot: bool = False
    repeats_at_same_step: bool = False
    same_step_reason: str = "{fault}: it recurred at step {step} with nothing left to change"


FAULT_CLASSES: dict[str, FaultClass] = {
    "config_error": FaultClass(restartable=False),
    "missing_dependency": FaultClass(restartable=False),
    "disk_full": FaultClass(restartable=False),
    "fp8_serializer": FaultClass(voids_save_in_progress=True),
    "cuda_oom": FaultClass(memory="gpu"),
    "host_oom_killed": FaultClass(memory="host"),
    "hang": FaultClass(repeats_at_same_spot=True),
    # A collective timeout at the same step again: the phase one rank works in alone there (a save, samples, a
    # validation, caching) outlasts the group's timeout, and no setting of this trainer's raises it.
    "nccl_timeout": FaultClass(
        repeats_at_same_step=True,
        same_step_reason="{fault}: a collective timed out again at step {step} with the same settings: one rank "
        "works alone there (a save, samples, a validation, caching) for longer than the process group's "
        "timeout, and this trainer has no timeout setting trainsup can raise; make that work shorter or "
        "less frequent, or give the process group a longer timeout"),
}
_PLAIN = FaultClass()


def fault_class(fault: str | None) -> FaultClass:
    """The properties of a fault id (a fault of a user's or an adapter's rule: the plain ones)."""
    return FAULT_CLASSES.get(fault or "", _PLAIN)


def not_restartable(rules: Iterable[FaultRule] = ()) -> frozenset[str]:
    """Fault ids a restart cannot fix: the table's and any rule's that says ``restartable: false``."""
    return frozenset({f for f, c in FAULT_CLASSES.items() if not c.restartable} |
                     {r.id for r in rules if not r.restartable})
