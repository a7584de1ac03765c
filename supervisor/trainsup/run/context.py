"""Owns what one run holds open and closes: the run dir and its lock and lease, the journal and its
listeners, the ledger, the trainer session, systemd's notifier and the sensors (file watcher, GPU guard).

``open_run`` finds the run's home, refuses a run dir another run or a live supervisor owns before
anything is written, then claims it, takes over a dead supervisor's trainer, opens the records and
binds the trainer to them, and journals ``run_start``. ``RunContext.close`` stops the sensors, then
the listeners (they may journal while they drain), then the journal and the notifier.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..record import journalkinds as kinds
from ..record.journal import Journal, JournalListener
from ..record.ledger import Ledger
from ..sensors.watch import FileWatcher
from ..trainers.base import Setup, StateStore, TrainerRun, UsageError
from ..trainers.registry import open_run as open_trainer
from .console import CONSOLE
from .gpuguard import GpuGuard
from .ownership import Ownership, Refused, claim
from .policy import Policy
from .rundir import Home, IdentityError, find_home, record_identity, refusal
from .sdnotify import Notifier, status_line
from .spec import RunSpec
from .takeover import take_over


def say(message: str) -> None:
    CONSOLE.say(f"trainsup: {message}")  # on a line of its own, never on the trainer's


@dataclass(kw_only=True)
class RunContext:
    spec: RunSpec
    home: Home
    owner: Ownership
    journal: Journal
    ledger: Ledger
    trainer: TrainerRun
    listeners: tuple[JournalListener, ...]
    notifier: Notifier
    gpu: GpuGuard | None = None  # from just before the first launch (its baseline is taken then)
    watcher: FileWatcher | None = None  # from just before the first launch

    @property
    def run_dir(self) -> Path:
        return self.home.run_dir

    @property
    def points(self) -> StateStore:
        """The trainer's states: where they go, which are complete, the resume point."""
        return self.trainer.states

    def status(self, **fields: Any) -> None:
        """status.json, and the same story in one line for systemd."""
        self.journal.status(**fields)
        self.notifier.status(status_line(self.journal.snapshot()))

    def close(self) -> None:
        for sensor in (self.watcher, self.gpu):
            if sensor is not None:
                sensor.stop()
        for listener in self.listeners:  # before the journal: a listener may journal while it drains
            listener.close()
        self.journal.close()
        self.notifier.close()


def open_trainer_run(spec: RunSpec, policy: Policy) -> TrainerRun | int:
    """The adapter chosen for the command (``UsageError``: said, exit 2)."""
    trainer = spec.trainer if spec.trainer is not None else (spec.project.trainer if spec.project else None)
    try:
        return open_trainer(Setup(tuple(spec.argv), spec.cwd, policy.trainer_settings()), trainer)
    except UsageError as exc:
        say(f"error: {exc}")
        return 2


def open_run(spec: RunSpec, policy: Policy, t: TrainerRun, listeners: Sequence[JournalListener],
             notifier: Notifier) -> RunContext | int:
    """The run's records opened and claimed, or the exit code of a refusal (said, nothing left behind)."""
    try:
        home = find_home(t, spec.run_dir, spec.cwd, spec.start, os.environ)
    except IdentityError as exc:
        say(f"error: {exc}")
        return 2
    run_dir = home.run_dir
    refused = refusal(home, t, Ledger.load(run_dir / "ledger.json"), spec.start)
    if refused is not None:  # before the run dir is made or locked: nothing is left behind
        say(refused[1] if refused[0] == 0 else f"error: {refused[1]}")
        return refused[0]
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        owner = claim(run_dir, policy.lease_stale_s)  # the lock, and the lease other hosts see
    except Refused as exc:
        say(f"error: {exc}")
        return 2
    except OSError as exc:
        say(f"error: cannot use run dir {run_dir}: {exc}")
        return 2
    record_identity(home, t)
    journal = Journal(run_dir)
    for listener in listeners:
        journal.listen(listener)
    owner.journal_takeover(journal, say)
    take_over(run_dir, journal, say, policy.stop_grace_s, owner.me)  # a dead one's run
    ledger = Ledger.load(run_dir / "ledger.json")
    t.bind(run_dir, ledger, journal, say)
    t.states.continue_ledger()
    ctx = RunContext(spec=spec, home=home, owner=owner, journal=journal, ledger=ledger, trainer=t,
                     listeners=tuple(listeners), notifier=notifier)
    _journal_start(ctx, policy)
    return ctx


def _journal_start(ctx: RunContext, policy: Policy) -> None:
    spec, t, home, journal = ctx.spec, ctx.trainer, ctx.home, ctx.journal
    project = spec.project.name if spec.project else t.label or ctx.run_dir.name
    journal.event(kinds.RUN_START, argv=list(spec.argv), run_dir=str(ctx.run_dir), policy=policy.source,
                  project=project, trainer=t.family, samples=t.samples_record())
    ctx.status(trainer=t.family)
    separate = home.choice.note(home.identity) if home.choice is not None else None
    if separate is not None:
        say(separate)
        journal.event(kinds.RUN_SEPARATE, note=separate,
                      others=[str(o.run_dir) for o in home.choice.others] if home.choice else [])
    for note in t.notes:
        say(note)
        journal.event(kinds.PLAN_ADJUSTED, note=note)
