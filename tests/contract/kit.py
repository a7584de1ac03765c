"""What the engine does with an adapter's launch, for tests that drive an adapter without it: the
trainer makes the attempt's ``Launch`` and the engine enters it in the state store (``begin``)."""

from __future__ import annotations

from pathlib import Path

from trainsup.record.ledger import StateRecord
from trainsup.trainers.base import Plan, TrainerRun


def launched(run: TrainerRun, plan: Plan, attempt: int, resume: StateRecord | None, run_dir: Path) -> list[str]:
    """The attempt's argv, launched as the engine launches it (``launch``, then ``states.begin``)."""
    launch = run.launch(plan, attempt, resume, run_dir)
    run.states.begin(attempt, launch)
    return list(launch.argv)
