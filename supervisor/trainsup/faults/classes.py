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


FAULT_CLASSES: dict[str, FaultClass] = {
    "config_error": FaultClass(restartable=False),
    "missing_dependency": FaultClass(restartable=False),
    "disk_full": FaultClass(restartable=False),
    "fp8_serializer": FaultClass(voids_save_in_progress=True),
    "cuda_oom": FaultClass(memory="gpu"),
    "host_oom_killed": FaultClass(memory="host"),
    "hang": FaultClass(repeats_at_same_spot=True),
}
_PLAIN = FaultClass()


def fault_class(fault: str | None) -> FaultClass:
    """The properties of a fault id (a fault of a user's or an adapter's rule: the plain ones)."""
    return FAULT_CLASSES.get(fault or "", _PLAIN)


def not_restartable(rules: Iterable[FaultRule] = ()) -> frozenset[str]:
    """Fault ids a restart cannot fix: the table's and any rule's that says ``restartable: false``."""
    return frozenset({f for f, c in FAULT_CLASSES.items() if not c.restartable} |
                     {r.id for r in rules if not r.restartable})
