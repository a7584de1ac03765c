"""Owns the trainer contract: everything the engine, ``doctor``, ``diagnose`` and ``status`` may know
of a trainer, and nothing more.

A *family* (``TrainerFamily``: sd-scripts, LitGPT, any command, ...) claims a command line
(``detect``, on the claim scale below) and opens a *session* for one run (``open`` -> ``TrainerRun``).
A session is composed of parts, each with a default that knows nothing:

- the launch plan (``Plan``): the settings a remedy reads and changes; ``apply`` changes only the plan
  it is given (the engine also calls it on dry-run copies), and ``launch`` turns a plan into the next
  attempt's ``Launch`` value (argv, environment overrides, the resume step, the output name), writing
  only derived files of the attempt's own, so nothing an earlier attempt wrote is overwritten;
- saved states (``states``, a ``StateStore``; ``NoStates`` until ``bind``): which exist, their true
  steps, which are complete. The engine enters each attempt in it (``begin``) with the ``Launch``;
  ``stepstates.StepStates`` is the store for "states are directories matching a pattern, complete
  when these files are there", ``accelerate`` knows ``accelerator.save_state``'s directories;
- the remedy ladders in the trainer's own terms (``ladder``, ``apply``) and fault rules of its own;
- its output (``output``, an ``OutputFormat``): progress, saved-state and success lines, phases, and
  any start-up summary the adapter itself reads back (``on_summary``);
- the inputs to watch and how an edit applies (``inputs``);
- doctor checks (``doctor``), given what ``trainsup doctor`` found outside the trainer
  (``doctor_facts``: the interpreter's versions of ``doctor_packages``, the script's exact flags
  when known), and a saved state's estimated size (``state_size``) for the free-space check.

Nothing in the contract depends on the order the engine calls it in: what a call needs (the plan a
ladder or a resume point is for) is passed to it.

Families are found through the ``trainsup.trainers`` entry-point group (``registry``), so a
trainer's own package can ship one. ``run/`` imports this module and the registry, never an adapter.
A walk-through of adding one is ``docs/dev/adapters.md``.
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
from ..faults.progress import Progress
from ..faults.remedies import Action, Rung
from ..faults.rules import FaultRule
from ..faults.verdict import NOTHING_SAID, Said
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


@dataclass(frozen=True)
class PreStep:
    """A program the engine runs to its end before the attempt's trainer, in the trainer's working
    directory and environment, its output in ``RUN_DIR/before/attempt-N.K.log`` (musubi-tuner's caching
    scripts, when a remedy or an accepted edit changed what its caches are made from). One that fails
    stops the run: the trainer is never launched without what it needs."""

    argv: tuple[str, ...]
    says: str  # what it does, in words (``caching the latents again at 48x48 into RUN_DIR/caches``)


@dataclass(frozen=True)
class Launch:
    """What ``TrainerRun.launch`` makes of a plan for one attempt: the engine starts ``argv`` with
    ``env`` on top of the inherited environment, and enters the attempt in the state store with it
    (``StateStore.begin``); ``before``, when there are any, run first, one after the other."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    resume_step: int = 0  # the true step the attempt starts from (0: the beginning)
    output_name: str | None = None  # the name it writes under, when the trainer has one (kohya's)
    # The true step minus the step the trainer prints and names its saves by: 0 for a trainer that
    # counts true steps; None while only its start-up summary can tell (``on_summary``).
    label_offset: int | None = 0
    before: tuple[PreStep, ...] = ()

    @classmethod
    def of(cls, plan: Plan, argv: Sequence[str], resume: StateRecord | None = None, **fields: Any) -> Launch:
        """The launch of ``plan``'s environment with ``argv``, resuming from ``resume``."""
        return cls(tuple(argv), dict(plan.env), resume.step if resume is not None else 0, **fields)


@dataclass(frozen=True)
class StateSaved:
    """An output line says a state save is over (``OutputFormat.state_completed``)."""

    dir: str | None = None  # the state's directory when the line names it; None: look on disk for it


@dataclass(frozen=True)
class SummaryLine:
    """Facts of the trainer's start-up summary one output line states (``OutputFormat.summary``).
    The engine gathers them and hands them to ``TrainerRun.on_summary``: what they mean is the
    adapter's own business (kohya: batches per epoch and gradient accumulation, its step labels)."""

    facts: Mapping[str, Any]
    complete: bool = False  # the summary's last line: the adapter hears it at once


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

    def state_completed(self, line: str) -> StateSaved | None:
        """A state whose last file was just written, by its directory or to be looked for on disk."""
        return None

    def state_started(self, line: str) -> int | None:
        """The trainer's label of a state save that begins."""
        return None

    def is_success(self, line: str) -> bool:
        return False

    def summary(self, line: str) -> SummaryLine | None:
        """What a line of the trainer's start-up summary states, or None."""
        return None


class StateStore(Protocol):
    """The run's resume points: the states each attempt saved, with their true steps, in the ledger.

    ``NoStates`` is the store that knows none; ``ledgerstates.LedgerStates`` holds what every store
    of real states shares, ``stepstates.StepStates`` is the one for step directories."""

    run_complete: bool  # the last step's state is complete: the engine stops the trainer, run done
    # A state is complete that the trainer is better resumed from at once (kohya: the end of a segment
    # whose cadence would write too many saves): the engine stops it and relaunches, no budget spent.
    relaunch_at_state: bool

    def continue_ledger(self) -> None:
        """A ledger of an earlier supervisor of this run dir is loaded: take up its last attempt."""
    def begin(self, attempt: int, launch: Launch) -> None:
        """The engine is about to start ``launch`` as attempt ``attempt``: enter it in the ledger."""
    def collect(self, only: Path | None = None) -> list[StateRecord]:
        """Claim the complete states the running attempt wrote (``only``: that directory)."""
    def steps_proven(self) -> int: ...
    def newest(self, nan_step: int | None = None, max_steps: int | None = None,
               plan: Plan | None = None) -> StateRecord | None:
        """The state the next launch of ``plan`` (None: the last launched) resumes from, or None."""
    def adopt(self, path: Path) -> str: ...
    def save_failed(self, label: int) -> None:
        """The save the trainer announced under this label (``OutputFormat.state_started``) failed
        half-way: never resume from what it left."""
    def mark_tainted(self, from_step: int) -> None: ...
    def final_written(self) -> bool: ...
    def publish_final(self) -> str | None: ...


class NoStates:
    """The store of a trainer whose states trainsup does not know: nothing to claim or resume from,
    and exit 0 alone is success. Every session has it until ``bind`` sets its own."""

    run_complete = False
    relaunch_at_state = False

    def continue_ledger(self) -> None:
        return None

    def begin(self, attempt: int, launch: Launch) -> None:
        return None

    def collect(self, only: Path | None = None) -> list[StateRecord]:
        return []

    def steps_proven(self) -> int:
        return 0

    def newest(self, nan_step: int | None = None, max_steps: int | None = None,
               plan: Plan | None = None) -> StateRecord | None:
        return None

    def adopt(self, path: Path) -> str:
        return ""

    def save_failed(self, label: int) -> None:
        return None

    def mark_tainted(self, from_step: int) -> None:
        return None

    def final_written(self) -> bool:
        return True  # exit 0 is success: there is no other marker to wait for

    def publish_final(self) -> str | None:
        return None


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
        self.states = NoStates()  # until ``bind`` gives the run its own
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

    def output_dirs(self) -> list[Path]:
        """The directories the trainer writes weights files straight into, beside its states: where a
        half-done write of a killed attempt is looked for before the next one (``trainers.debris``).
        Default: the output directory, when the command names one."""
        return [self.output_dir] if self.output_dir is not None else []

    def samples_record(self) -> dict[str, Any] | None:
        """``run_start``'s ``samples``: where the page (``trainsup web``) finds the sample images."""
        found = self.samples()
        return None if found is None else found.record(self.output.absolute_steps)

    @abstractmethod
    def bind(self, run_dir: Path, ledger: Ledger, journal: Journal, say: Say) -> None:
        """The run dir, its ledger and journal exist: set up ``states`` and ``inputs``."""

    @abstractmethod
    def launch(self, plan: Plan, attempt: int, resume: StateRecord | None, run_dir: Path) -> Launch:
        """This attempt's launch (resume arguments in its argv, derived copies written).

        ``plan`` is the engine's copy for this launch: the adapter may change it. The engine then
        enters the attempt in ``states`` (``begin``) with the value returned; ``launch`` never does.
        May raise ``OSError`` when a derived file cannot be written: the engine then never launches.
        """

    # --- remedies ----------------------------------------------------------------------------------
    def rules(self) -> tuple[FaultRule, ...]:
        """Fault rules of this trainer, tried before the built-in table."""
        return ()

    @abstractmethod
    def ladder(self, fault: str, plan: Plan | None = None) -> tuple[Rung, ...]:
        """The remedy ladder of a fault class in this trainer's terms, for ``plan`` (None: the
        session's own ``plan``)."""

    @abstractmethod
    def apply(self, plan: Plan, action: Action, evidence: Said = NOTHING_SAID) -> str | None:
        """Apply one action to ``plan`` and to nothing else (the engine also tries actions on dry-run
        copies); what changed in words, or None when it means nothing here. ``evidence``: the fault's
        line and its rule's named groups (an action that needs a number from it reads the group)."""

    def python(self, env: Mapping[str, str]) -> str | None:
        """The interpreter that runs the trainer (for an environment upgrade), when it can be told."""
        return None

    @abstractmethod
    def command_line(self, plan: Plan) -> list[str]:
        """The plan's command as the user would type it (``diagnose`` prints the corrected one)."""

    def plan_notes(self, plan: Plan) -> list[str]:
        """What a user must also change by hand to apply this plan without trainsup."""
        return []

    def on_summary(self, summary: Mapping[str, Any]) -> Notice | None:
        """The facts of the trainer's start-up summary read so far (``OutputFormat.summary``); a
        warning to journal and say, or None. Heard again with each saved state and at the end."""
        return None

    def upgrade_spec(self, action: Action, evidence: Said) -> str:
        """The package spec an ``upgrade`` action installs, given the fault's evidence (its line and
        its rule's named groups)."""
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


# The claim scale: what ``TrainerFamily.detect`` answers, from surest to weakest.
NAMES_SCRIPT = 10  # the family names the command's script (kohya: train_network.py; litgpt finetune_lora)
TELLTALE = 5  # flags only this family's trainers take; counts only when no family names the script
ANY_COMMAND = 1  # any command at all (the ``command`` family: no trainer knowledge)
NO_CLAIM = 0


class TrainerFamily(Protocol):
    """An adapter: registered under the ``trainsup.trainers`` entry-point group.

    Detection is a claim scale, not a contest of flag counts. A family answers ``detect`` with
    ``NAMES_SCRIPT`` when it names the command's script (a script name, a console script and its
    subcommand, a ``-m`` module): a script's name decides first, and only the families that name it
    compete. ``TELLTALE`` is for a script no family names whose flags only this family's trainers
    take (a renamed copy of an sd-scripts script with ``--network_module``); a flag that trainers of
    other families take too (``--pretrained_model_name_or_path``: every diffusers script) is no
    telltale. ``ANY_COMMAND`` is the ``command`` family's. Among equal claims the registry takes the
    family whose name sorts last, so claims should not tie: a family names only its own scripts.

    Optional: ``ladder(fault) -> tuple[Rung, ...]``, for a family whose remedy ladder needs no
    command: ``diagnose`` proposes it for a log without a command line that it read as the family's
    (its rules read the evidence, or its output format the log's lines).
    """

    name: str
    description: str

    def detect(self, argv: Sequence[str]) -> int:
        """How this family claims the command, on the claim scale (``NO_CLAIM``: not at all)."""
        ...

    def open(self, setup: Setup) -> TrainerRun:
        """A session for one run; raises ``UsageError`` for a command or file it cannot use."""
        ...

    def rules(self) -> tuple[FaultRule, ...]:
        """The family's own fault rules for a log of any trainer (``diagnose``, which may not know
        the command). A run's ``TrainerRun.rules()`` may add rules too weak for unknown logs."""
        ...

    def output(self) -> OutputFormat:
        """A fresh format of the family's output: ``diagnose``, which may not know the trainer, reads a
        log with every family's (its progress drops evidence training outlived; its success line)."""
        ...


@dataclass(frozen=True)
class Family:
    """A ``TrainerFamily`` made of its parts, for an adapter that needs nothing more: its name and
    description, how it claims a command (``claim``, on the claim scale), the session it opens
    (``session``: the ``TrainerRun`` class, or any callable taking the ``Setup``), the format of its
    output (``output_format``: a class or factory; the default knows nothing) and its family rules."""

    name: str
    description: str
    claim: Callable[[Sequence[str]], int]
    session: Callable[[Setup], TrainerRun]
    output_format: Callable[[], OutputFormat] = OutputFormat
    family_rules: tuple[FaultRule, ...] = ()

    def detect(self, argv: Sequence[str]) -> int:
        return self.claim(argv)

    def open(self, setup: Setup) -> TrainerRun:
        return self.session(setup)

    def output(self) -> OutputFormat:
        return self.output_format()

    def rules(self) -> tuple[FaultRule, ...]:
        return self.family_rules


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


def rung_applies(trainer: TrainerRun, plan: Plan, rung: Rung, evidence: Said = NOTHING_SAID) -> bool:
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
