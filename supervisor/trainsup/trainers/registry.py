"""Owns finding the trainer adapters and choosing one for a command.

Adapters are registered under the ``trainsup.trainers`` entry-point group (the built-ins in this
project's ``pyproject.toml``, others by any installed package): each entry point names an object
with the ``TrainerFamily`` shape. A project's ``trainer:`` key names one outright (a string), or is a
mapping for the declarative adapter; otherwise the family that claims the command most surely runs
it, on the claim scale of ``base.TrainerFamily``: a family that names the script outranks any
telltale flags, and the ``command`` family (any command, no trainer knowledge) claims least.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from importlib.metadata import entry_points
from typing import Any

from ..faults.progress import AnyProgress
from ..faults.rules import FaultRule
from .base import Setup, TrainerFamily, TrainerRun, UsageError

GROUP = "trainsup.trainers"
DECLARATIVE = "declarative"


@functools.cache
def families() -> dict[str, TrainerFamily]:
    found: dict[str, TrainerFamily] = {}
    for ep in sorted(entry_points(group=GROUP), key=lambda e: e.name):
        try:
            family = ep.load()
        except Exception as exc:  # noqa: BLE001 - a broken third-party adapter must not stop trainsup
            raise UsageError(f"the trainer adapter {ep.name!r} ({ep.value}) cannot be loaded: {exc}") from None
        found[ep.name] = family
    if not found:
        raise UsageError("no trainer adapters are registered: install trainsup (pip install -e .) so its "
                         f"entry points ({GROUP}) exist")
    return found


def family_rules() -> tuple[FaultRule, ...]:
    """Every adapter's own fault rules (``TrainerFamily.rules``): ``diagnose`` reads logs whose
    trainer it may not know, so it tries them all before the built-in table."""
    return tuple(rule for family in families().values() for rule in family.rules())


def known_output() -> AnyProgress:
    """Every family's output format at once, for a log whose trainer is not known (``diagnose``)."""
    return AnyProgress([family.output() for family in families().values()])


def choose(argv: Sequence[str], trainer: str | Mapping[str, Any] | None = None) -> TrainerFamily:
    """The family for this command: the one ``trainer`` names, else the best ``detect`` score."""
    known = families()
    if isinstance(trainer, Mapping):
        trainer = DECLARATIVE
    if trainer is not None:
        if trainer not in known:
            raise UsageError(f"trainer: unknown adapter {trainer!r}; known: {', '.join(sorted(known))}")
        return known[trainer]
    scored = sorted(((f.detect(argv), name) for name, f in known.items()), reverse=True)
    score, name = scored[0]
    if score <= 0:
        raise UsageError("no trainer adapter accepts this command")
    return known[name]


def open_run(setup: Setup, trainer: str | Mapping[str, Any] | None = None) -> TrainerRun:
    if not setup.argv:
        raise UsageError("the command is empty: give the training command after `--`")
    section = trainer if isinstance(trainer, Mapping) else None
    family = choose(setup.argv, trainer)
    if section is not None and setup.section is None:
        setup = Setup(setup.argv, setup.cwd, setup.settings, section)
    run = family.open(setup)
    run.given_argv = tuple(setup.argv)
    return run
