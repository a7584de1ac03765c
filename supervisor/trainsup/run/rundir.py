"""Owns where a run keeps its records and whether it may start there: one run dir is one run.

Before anything is launched the engine asks, from the run's identity (``record.identity``, the
fields the trainer adapter reads from the user's command): is there an earlier record of this run
(continue it: resume from its states), another run's records (start fresh in a run dir of its own,
leaving the other run's files as they are), a run that already finished (nothing to train: say
where its weights are), or, for a run that starts fresh, weights and states already lying under its
output names (refuse: a new run never trains over them)? ``--fresh`` and ``--resume`` make the
choice explicit.
"""

from __future__ import annotations

import time
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..record.identity import (
    Choice,
    Identity,
    IdentityError,
    PastRun,
    candidates,
    choose,
    has_records,
    write_identity,
)
from ..record.ledger import Ledger
from ..trainers.base import TrainerRun

Start = Literal["auto", "fresh", "resume"]
# Set by a supervisor that hands its run over to a new one on an edited project (``Supervisor._hand_over``):
# the new one keeps the run dir (and the lock it inherits), whatever the edit changed.
HANDED_OVER_ENV = "TRAINSUP_HANDED_OVER_RUN_DIR"


@dataclass(frozen=True)
class Home:
    run_dir: Path
    identity: Identity
    choice: Choice | None  # None: handed over by the supervisor before, on an edited command
    explicit: bool

    @property
    def past(self) -> PastRun | None:
        return self.choice.past if self.choice is not None else None


def find_home(trainer: TrainerRun, run_dir: Path | None, cwd: Path, start: Start,
              env: MutableMapping[str, str]) -> Home:
    """The run dir of this run; ``IdentityError`` when the named one cannot be."""
    identity = Identity(trainer.identity())
    handed = env.pop(HANDED_OVER_ENV, None)
    if handed:
        return Home(Path(handed), identity, None, True)
    base = (run_dir or trainer.default_run_dir(cwd)).resolve()
    choice = choose(base, identity, trainer.given_argv, trainer.label, explicit=run_dir is not None,
                    fresh=start == "fresh")
    return Home(choice.run_dir, identity, choice, run_dir is not None)


def this_runs_dir(trainer: TrainerRun, run_dir: Path | None, cwd: Path, exact: bool = False) -> Path:
    """Where this run's records are (or would go), reading only. Cheap unless ``exact`` (a queue entry,
    a job script: the run dir the next start will choose): an output dir with one run's records names
    that run (the page asks a few times a second), one with several is told apart by identity."""
    base = (run_dir or trainer.default_run_dir(cwd)).resolve()
    if run_dir is not None:
        return base
    if not exact and len([d for d in candidates(base) if has_records(d)]) <= 1:
        return base
    try:  # the run dir a start would choose now (choosing makes nothing)
        return choose(base, Identity(trainer.identity()), trainer.given_argv, trainer.label, explicit=False,
                      fresh=False).run_dir
    except (OSError, IdentityError):
        return base


def refusal(home: Home, trainer: TrainerRun, ledger: Ledger, start: Start) -> tuple[int, str] | None:
    """Why this run does not start here, with its exit code (0: it already finished), or None."""
    past = home.past
    if start == "resume" and not ledger.states:
        where = f"{home.run_dir}" if past is not None else "here"
        others = home.choice.others if home.choice is not None else ()
        beside = f"; beside it: {', '.join(str(o.run_dir) for o in others)} (another run's)" if others else ""
        return 2, (f"--resume: nothing of this run to resume from {where} (no complete state of it"
                   f"{' yet' if past is not None else ''}){beside}; run without --resume to start it")
    if past is not None and past.ended == "finished" and start != "fresh":
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(past.ended_at)) if past.ended_at else "earlier"
        weights = past.final_weights or "(no final weights recorded)"
        return 0, (f"this run finished on {when} ({home.run_dir}); its final weights are {weights}. "
                   "Nothing is trained again: to train it anew, pass --fresh (a new run of its own, which "
                   "never writes over those files)")
    if not ledger.attempts and trainer.user_resume is None:
        # (A command that resumes a state of its own continues those files on purpose: the adapter
        # then writes under names of its own attempts, never over them.)
        taken = trainer.existing_outputs()
        if taken:
            more = f" and {len(taken) - 1} more" if len(taken) > 1 else ""
            return 2, (f"{taken[0]}{more} already lie under this run's output names and are not this run's "
                       "(another run, or an earlier one of this command); a new run never trains over them: "
                       "move them away, or give this run another output name")
    return None


def edited(run_dir: Path, trainer: TrainerRun) -> None:
    """An edit of the run's inputs was taken (a config's learning rate, a caption): the run is still
    this run, so its identity is what the files say now (a later start compares against that)."""
    try:
        write_identity(run_dir, Identity(trainer.identity()), trainer.label, replaced=True)
    except (OSError, ValueError):
        pass


def record_identity(home: Home, trainer: TrainerRun) -> None:
    """Write ``identity.json`` once (again after a hand-over: the user's edit is this run's)."""
    try:
        write_identity(home.run_dir, home.identity, trainer.label, replaced=home.choice is None)
    except OSError:
        pass  # a full disk must not end supervision; the next start compares by command then


__all__ = ["HANDED_OVER_ENV", "Home", "IdentityError", "Start", "edited", "find_home", "record_identity", "refusal",
           "this_runs_dir"]
