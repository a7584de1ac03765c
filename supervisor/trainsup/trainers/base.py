"""Owns the trainer contract: everything the engine, ``doctor``, ``diagnose`` and ``status`` may know
of a trainer, and nothing more.

A *family* (``TrainerFamily``: sd-scripts, LitGPT, any command, ...) recognises a command line
(``detect``) and opens a *session* for one run (``open`` -> ``TrainerRun``). The session owns what
only the trainer knows:

- the launch plan (``Plan``): the settings a remedy reads and changes, and ``launch`` turning it into
  the next attempt's argv (resume arguments, derived config copies, an output name or out dir of the
  attempt's own so nothing an earlier attempt wrote is overwritten);
- saved states (``states``, a ``StateStore``): which exist, their true steps, which are complete;
- the remedy ladders in the trainer's own terms (``ladder``, ``apply``) and fault rules of its own;
- its output (``output``, an ``OutputFormat``): progress, saved-state and success lines, phases;
- the inputs to watch and how an edit applies (``inputs``);
- doctor checks (``doctor``), given what ``trainsup doctor`` found outside the trainer
  (``doctor_facts``: the interpreter's versions of ``doctor_packages``, the script's exact flags
  when known), and a saved state's estimated size (``state_size``) for the free-space check.

Families are found through the ``trainsup.trainers`` entry-point group (``registry``), so a
trainer's own package can ship one. ``run/`` imports this module and the registry, never an adapter.
"""

from __future__ import annotations

import re
import signal
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from ..faults import remedies
from ..faults.matchers import Progress
from ..faults.remedies import Action, Rung
from ..faults.rules import FaultRule
from ..record.journal import Journal
from ..record.ledger import Ledger, StateRecord
from ..sensors.watch import FileWatcher

Say = Callable[[str], None]
# What an edited input asks of the engine: nothing, a restart at the next complete state, a restart now.
EditAction = Literal["none", "at_checkpoint", "now"]
Severity = Literal["blocker", "warning", "info"]


class UsageError(ValueError):
    """Bad command or files: exit 2 before anything is launched."""


@dataclass(frozen=True)
class Settings:
    """The policy keys a trainer session reads (the engine passes them anew after a policy edit)."""

    save_every_n_steps: int | None = None  # None: about 10% of the run's steps
    snapshot_prompts: bool = True
    on_prompt_change: str = "at_checkpoint"


@dataclass(frozen=True)
class Setup:
    """What a session starts from: the user's command, where it runs, and the project's ``trainer:``."""

    argv: tuple[str, ...]
    cwd: Path
    settings: Settings = field(default_factory=Settings)
    section: Mapping[str, Any] | None = None  # a project's ``trainer:`` mapping (the declarative adapter)
    # The command exactly as given, for reading only (``diagnose``): add nothing to it, and take files
    # that are not on this machine as unknown rather than as an error.
    as_given: bool = False


@dataclass(frozen=True)
class Finding:
    """One doctor finding: a blocker (the run would fail), a warning, or information."""

    severity: Severity
    id: str
    message: str
    fix: str = ""


@dataclass(frozen=True)
class DoctorFacts:
    """What ``trainsup doctor`` found outside the adapter, set as ``TrainerRun.doctor_facts`` before
    it calls ``TrainerRun.doctor``."""

    python: str | None = None  # the trainer's interpreter, when it was found and answered
    # its versions of ``torch`` and ``TrainerRun.doctor_packages`` (None: not installed); empty when
    # there is no ``python``
    versions: Mapping[str, str | None] = field(default_factory=dict)
    # The script's exact flags, when doctor has its argument parser (a stand-in trainer bundled with
    # trainsup, the demo); None: the adapter's own knowledge of the script decides.
    script_flags: frozenset[str] | None = None


@dataclass(frozen=True)
class Samples:
    """Where a trainer writes its sample images, for the page (``trainsup web``) to show them.

    ``step_pattern``'s first group is the trainer's step in a sample's file name, counted as its
    progress bar counts (``OutputFormat.absolute_steps``); a name it does not match is placed by time.
    """

    dirs: tuple[Path, ...]
    step_pattern: str | None = None

    def record(self, absolute_steps: bool) -> dict[str, Any]:
        """The ``samples`` field of ``run_start``."""
        return {"dirs": [str(d) for d in self.dirs], "step_pattern": self.step_pattern,
                "absolute_steps": absolute_steps}


@dataclass(frozen=True)
class Notice:
    """A warning of the trainer's: journaled (``warning`` with ``fields``) and said on the console."""

    message: str
    console: str
    fields: Mapping[str, Any] = field(default_factory=dict)


class Plan(ABC):
    """The next launch's settings. Adapters subclass it; the engine only copies it and reads ``env``
    (overrides on top of the inherited environment)."""

    env: dict[str, str]

    @abstractmethod
    def copy(self) -> Plan: ...


@dataclass
class ArgvPlan(Plan):
    """A plan that is the command line itself (adapters without flags to edit)."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)

    def copy(self) -> ArgvPlan:
        return ArgvPlan(list(self.argv), dict(self.env))


class OutputFormat:
    """What the trainer's output lines mean. The default knows nothing: any line is activity.

    ``progress_hint`` is a cheap substring gate (only lines holding it reach ``progress``);
    ``bookkeeping`` gates the rest of the matchers. Both run on the pump threads: keep them cheap.
    """

    progress_hint: str | None = None
    bookkeeping: re.Pattern[str] | None = None
    # (marker, phase): a line holding the marker starts a phase that prints but moves no step
    phase_starts: tuple[tuple[str, str], ...] = ()
    any_line_is_activity = True  # no progress to go by: every line shows the trainer is alive
    announces_states = False  # False: no line says a state is complete; the engine looks on disk
    absolute_steps = True  # the printed step is the true step (False: counted from the resume point)

    def progress(self, line: str) -> Progress | None:
        return None

    def is_plain_redraw(self, line: str) -> bool:
        """A progress redraw that carries no fault evidence (the scanner only notes it)."""
        return False

    def state_completed(self, line: str) -> str | None:
        """The directory of a state whose last file was just written ('' = look on disk)."""
        return None

    def state_started(self, line: str) -> int | None:
        """The trainer's label of a state save that begins."""
        return None

    def is_success(self, line: str) -> bool:
        return False

    def batches_per_epoch(self, line: str) -> int | None:
        return None

    def grad_accum(self, line: str) -> int | None:
        return None


class StateStore(Protocol):
    """The run's resume points: the states each attempt saved, with their true steps, in the ledger."""

    run_complete: bool  # the last step's state is complete: the engine stops the trainer, run done
    # A state is complete that the trainer is better resumed from at once (kohya: the end of a segment
    # whose cadence would write too many saves): the engine stops it and relaunches, no budget spent.
    relaunch_at_state: bool

    def continue_ledger(self) -> None: ...
    def begin(self, attempt: int, resume_step: int, output_name: str | None = None) -> object: ...
    def collect(self, only: Path | None = None) -> list[StateRecord]: ...
    def steps_proven(self) -> int: ...
    def newest(self, nan_step: int | None = None, max_steps: int | None = None) -> StateRecord | None: ...
    def adopt(self, path: Path) -> str: ...
    def mark_failed_save(self, label: int) -> None: ...
    def mark_tainted(self, from_step: int) -> None: ...
    def final_written(self) -> bool: ...
    def publish_final(self) -> str | None: ...


class Inputs:
    """Files the run reads besides its command (prompts, configs, datasets). Default: none."""

    def watch(self, watcher: FileWatcher) -> None:
        return None

    def owns(self, path: Path) -> bool:
        return False

    def on_change(self, path: Path, kind: str, plan: Plan | None = None) -> EditAction:
        """An edit of a file ``watch`` watches; ``plan`` (the current one) takes what remedies read."""
        return "none"

    def settings_changed(self, settings: Settings) -> None:
        return None


class TrainerRun(ABC):
    """One run of one trainer: created by ``TrainerFamily.open``, then ``bind`` once the run dir exists."""

    family: str = ""
    output_dir: Path | None = None
    total_steps: int | None = None  # the steps the user asked for, when the command says
    user_resume: Path | None = None  # a state the user's own command resumes from
    # The signal of a planned stop (an edit applied at a checkpoint): SIGTERM, or one the trainer
    # answers by saving first (OneTrainer: SIGINT; then the deadline signal's stop uses it too, see
    # run.deadline). SIGKILL follows after the stop grace either way.
    planned_stop_signal: int = signal.SIGTERM
    settings_unknown: bool = False  # as given: some settings live in a file that is not here
    notes: list[str]  # said once at start and journaled (what trainsup changed, what it cannot do)
    plan: Plan
    output: OutputFormat
    states: StateStore
    inputs: Inputs

    def __init__(self) -> None:
        self.notes = []
        self.output = OutputFormat()
        self.inputs = Inputs()
        self.given_argv: tuple[str, ...] = ()  # the command as the user gave it (set by ``registry``)

    @property
    def label(self) -> str | None:
        """A short name for the run (kohya's ``--output_name``), or None."""
        return None

    def default_run_dir(self, cwd: Path) -> Path:
        return (self.output_dir or cwd) / ".trainsup"

    def samples(self) -> Samples | None:
        """Where this run's sample images go, when the trainer makes any."""
        return None

    def identity(self) -> dict[str, Any]:
        """What makes this run this run (``record.identity``), read from the user's command as given:
        the trainer, its script, base model, dataset, the settings that shape the weights, the seed and
        the output name. Default: the command line itself."""
        return {"trainer": self.family, "command": list(self.given_argv)}

    def existing_outputs(self) -> list[Path]:
        """Weights and states already under this run's output names (before it writes any): a new run
        never trains over them. Default: none known."""
        return []

    def samples_record(self) -> dict[str, Any] | None:
        """``run_start``'s ``samples``: where the page (``trainsup web``) finds the sample images."""
        found = self.samples()
        return None if found is None else found.record(self.output.absolute_steps)

    @abstractmethod
    def bind(self, run_dir: Path, ledger: Ledger, journal: Journal, say: Say) -> None:
        """The run dir, its ledger and journal exist: set up ``states`` and ``inputs``."""

    @abstractmethod
    def launch(self, plan: Plan, attempt: int, resume: StateRecord | None, run_dir: Path) -> list[str]:
        """The argv of this attempt (resume arguments, derived copies written); calls ``states.begin``.

        ``plan`` is the engine's copy for this launch: the adapter may change it (its ``env`` is used).
        May raise ``OSError`` when a derived file cannot be written: the engine then never launches.
        """

    # --- remedies ----------------------------------------------------------------------------------
    def rules(self) -> tuple[FaultRule, ...]:
        """Fault rules of this trainer, tried before the built-in table."""
        return ()

    @abstractmethod
    def ladder(self, fault: str) -> tuple[Rung, ...]:
        """The remedy ladder of a fault class in this trainer's terms."""

    @abstractmethod
    def apply(self, plan: Plan, action: Action, evidence: str | None = None) -> str | None:
        """Apply one action to the plan; what changed in words, or None when it means nothing here."""

    def python(self, env: Mapping[str, str]) -> str | None:
        """The interpreter that runs the trainer (for an environment upgrade), when it can be told."""
        return None

    @abstractmethod
    def command_line(self, plan: Plan) -> list[str]:
        """The plan's command as the user would type it (``diagnose`` prints the corrected one)."""

    def plan_notes(self, plan: Plan) -> list[str]:
        """What a user must also change by hand to apply this plan without trainsup."""
        return []

    def on_summary(self, batches_per_epoch: int | None, grad_accum: int | None) -> Notice | None:
        """The trainer's start-up summary was read; a warning to journal and say, or None."""
        return None

    def upgrade_spec(self, action: Action, evidence: str | None) -> str:
        """The package spec an ``upgrade`` action installs, given the fault's evidence line."""
        return remedies.upgrade_spec(action, evidence)

    # --- doctor ------------------------------------------------------------------------------------
    # The packages whose versions doctor asks the trainer's interpreter for (besides torch), for this
    # adapter's checks. Empty: the trainer need not even be Python, so an interpreter that cannot be
    # found or asked is information, not a warning.
    doctor_packages: tuple[str, ...] = ()
    doctor_facts: DoctorFacts = DoctorFacts()  # set by ``trainsup doctor`` before it calls ``doctor``

    def doctor(self, env: Mapping[str, str]) -> list[Finding]:
        """Preflight findings on the command and the files it names (reading files only), and on
        ``doctor_facts`` (the interpreter's package versions, the script's exact flags)."""
        return []

    def state_size(self) -> tuple[float, str] | None:
        """One saved state's estimated size in bytes, and how it was estimated in words (``doctor``
        weighs it against the free space in ``output_dir``); None when it cannot be told."""
        return None


class TrainerFamily(Protocol):
    """An adapter: registered under the ``trainsup.trainers`` entry-point group."""

    name: str
    description: str

    def detect(self, argv: Sequence[str]) -> int:
        """How surely this family runs the command: 0 not at all; the highest score wins."""
        ...

    def open(self, setup: Setup) -> TrainerRun:
        """A session for one run; raises ``UsageError`` for a command or file it cannot use."""
        ...

    def rules(self) -> tuple[FaultRule, ...]:
        """The family's own fault rules for a log of any trainer (``diagnose``, which may not know
        the command). A run's ``TrainerRun.rules()`` may add rules too weak for unknown logs."""
        ...


def restart_with_same_settings(action: Action) -> str | None:
    """The actions every trainer carries out the same way (the engine does them, not a plan edit)."""
    if action.kind in ("restart", "upgrade", "stop", "wait_foreign"):
        return action.describe()
    return None


def apply_env(plan: Plan, action: Action) -> str | None:
    """``set_env``: the same for every trainer."""
    if plan.env.get(action.name) == action.value:
        return None
    plan.env[action.name] = action.value or ""
    return action.describe()


def rung_applies(trainer: TrainerRun, plan: Plan, rung: Rung, evidence: str | None = None) -> bool:
    """Whether a remedy rung would do anything for this command (a dry run on a copy of the plan),
    and is meant for this evidence (a rung with ``when`` names the wording it answers)."""
    if not rung.fits(evidence):
        return False
    trial = plan.copy()
    for action in rung.actions:
        if action.kind in ("restart", "upgrade", "stop", "wait_foreign"):
            return True
        try:
            if trainer.apply(trial, action, evidence) is not None:
                return True
        except (ValueError, OSError):
            continue
    return False
