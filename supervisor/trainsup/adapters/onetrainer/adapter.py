"""Owns OneTrainer behind the trainer contract: recognising ``python scripts/train.py --config-path
CONFIG.json [--config-value KEY=VALUE ...]`` (run from the OneTrainer root), the first plan, each
attempt's derived config, resume and output reading, the ladders and the doctor.

Every attempt runs on a derived copy of the config in ``RUN_DIR/attempt-N/config.json`` (the user's
file is only read): the remedies' keys, frozen copies of the concept and sample files, and
``continue_last_backup`` true for a resume (false otherwise). Before a resume, ``backup/`` is
cleared of every directory OneTrainer would take instead of the chosen backup (``states``), and the
keys a backup fixes (``lora_rank``, ``lora_alpha``, ``model_type``) are taken from its
``onetrainer_config/args.json``. Planned stops use SIGINT: OneTrainer then backs up before exiting.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...faults.remedies import Action, Rung
from ...faults.rules import FaultRule
from ...faults.verdict import NOTHING_SAID, Said
from ...record.fsutil import atomic_write_text
from ...record.journal import Journal
from ...record.ledger import Ledger, StateRecord
from ...trainers.base import (
    NAMES_SCRIPT,
    NO_CLAIM,
    Family,
    Finding,
    Launch,
    Plan,
    Samples,
    Say,
    Setup,
    TrainerRun,
    UsageError,
)
from ...trainers.interpreter import trainer_python
from . import doctor
from .backups import backup_args, backup_problem, parse_name
from .inputs import BACKUP_FIXED, OTInputs
from .output import OTOutput
from .plan import OTPlan, find_script
from .remedies import LR, apply_action, ladder
from .rules import FAMILY_RULES, RULES
from .states import OTStates

DEFAULT_WORKSPACE = "workspace/run"  # OneTrainer's defaults, relative to its root
DEFAULT_OUTPUT = "models/model.safetensors"


# Config keys that shape the weights (OneTrainer's own names).
_SHAPING = ("base_model_name", "model_type", "training_method", "learning_rate", "lora_rank", "lora_alpha",
            "optimizer.optimizer", "resolution", "epochs", "batch_size", "gradient_accumulation_steps",
            "concept_file_name", "train_dtype", "output_model_format")


class OneTrainerRun(TrainerRun):
    family = "onetrainer"
    plan: OTPlan
    planned_stop_signal = signal.SIGINT

    def __init__(self, setup: Setup) -> None:
        super().__init__()
        self.cwd = setup.cwd
        try:
            self.plan = OTPlan.parse(list(setup.argv), setup.cwd)
        except OSError as exc:
            if not setup.as_given:
                raise UsageError(f"--config-path: cannot read it: {exc.strerror or exc}") from None
            self.plan = OTPlan.parse(list(setup.argv), setup.cwd, read=False)
            self.settings_unknown = True
            self.notes.append(f"{self.plan.config_path} is not readable here: settings in it are unknown")
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        self.workspace = self.plan.path("workspace_dir") or setup.cwd / DEFAULT_WORKSPACE
        self.model_out = self.plan.path("output_model_destination") or setup.cwd / DEFAULT_OUTPUT
        self.output_dir = self.workspace
        try:
            self.epochs = self.plan.get_int("epochs")
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        self.lora = str(self.plan.value("training_method") or "").upper() == "LORA"
        self.ot_output = OTOutput()
        self.output = self.ot_output
        self._launched = self.plan  # the plan launched last (what a resume point is for, unless told)
        self._resume_step = 0
        self._attempt = 0
        self._say: Say = lambda _m: None
        if self.plan.get_bool("continue_last_backup", False):
            self._user_continue()

    def _user_continue(self) -> None:
        """The user's ``continue_last_backup``: the newest complete backup that still trains."""
        backup = self.workspace / "backup"
        names = sorted((p for p in backup.iterdir() if p.is_dir()), reverse=True) if backup.is_dir() else []
        for path in names:
            parsed = parse_name(path.name)
            if parsed is None or (self.epochs is not None and parsed.epoch >= self.epochs):
                continue
            if not backup_problem(path, self.lora):
                self.user_resume = path
                self.notes.append(f"continue_last_backup: trainsup resumes from {path} (the newest complete "
                                  "backup) and moves any later or partial one out of backup/ first")
                return
        self.notes.append(f"continue_last_backup: {backup} holds no complete backup to continue; "
                          "trainsup starts from the beginning")

    @property
    def label(self) -> str | None:
        return self.model_out.stem

    def identity(self) -> dict[str, Any]:
        """The settings of the config (and ``--config-value``s) that shape the weights, with where
        they go: a config edited live is the same run (the engine records the edit's identity)."""
        try:
            plan = OTPlan.parse(list(self.given_argv), self.cwd, read=not self.settings_unknown)
        except ValueError:  # the config cannot be read now: its path and command stand for it
            return {"trainer": self.family, "command": list(self.given_argv)}
        fields: dict[str, Any] = {"trainer": self.family, "workspace": str(self.workspace),
                                  "output_model_destination": str(self.model_out)}
        for key in _SHAPING:
            value = plan.value(key)
            fields[key] = value if isinstance(value, (str, int, float, bool)) or value is None else str(value)
        return fields

    def samples(self) -> Samples | None:
        # OneTrainer: WORKSPACE/samples/<i> - <prompt>/<ts>-training-sample-<global step>-<epoch>-<epoch step>.<ext>
        return Samples((self.workspace / "samples",), r"training-sample-(\d+)-\d+-\d+\.\w+$")

    def default_run_dir(self, cwd: Path) -> Path:
        return self.workspace / ".trainsup"

    def output_dirs(self) -> list[Path]:
        # The final model is written as a .tmpXXXXXX beside its destination, then renamed (real bed).
        return [self.workspace, self.model_out.parent]

    def bind(self, run_dir: Path, ledger: Ledger, journal: Journal, say: Say) -> None:
        self._say = say
        self.ot_states = OTStates(ledger, journal, say, self.workspace, self.model_out, self._epochs,
                                  self.lora, lambda: self.ot_output.saved_seen, self._not_tainted, run_dir)
        self.states = self.ot_states
        self.ot_inputs = OTInputs(self.plan, run_dir, journal, say)
        self.inputs = self.ot_inputs

    def _for(self, plan: Plan | None) -> OTPlan:
        return plan if isinstance(plan, OTPlan) else self._launched

    def _epochs(self, plan: Plan | None) -> int | None:
        try:
            return self._for(plan).get_int("epochs")
        except ValueError:
            return None

    def _not_tainted(self, state: StateRecord, plan: Plan | None) -> bool:
        """After a NaN remedy: only backups saved before the loss ran away."""
        ot = self._for(plan)
        return ot.resume_below is None or state.step < ot.resume_below or state.attempt > ot.tainted_by

    # --- launching -----------------------------------------------------------------------------
    def launch(self, plan: Plan, attempt: int, resume: StateRecord | None, run_dir: Path) -> Launch:
        assert isinstance(plan, OTPlan)
        self._launched = plan
        extra: dict[str, Any] = {"continue_last_backup": resume is not None}
        start_epoch = 0
        if resume is not None:
            state = Path(resume.dir)
            self.ot_states.clear_for_resume(state, run_dir, attempt)
            parsed = parse_name(state.name)
            start_epoch = parsed.epoch if parsed is not None else 0
            args = backup_args(state)
            for key in BACKUP_FIXED:
                if key in args and args[key] != plan.value(key):
                    extra[key] = args[key]
                    self._say(f"{key}: {args[key]} from {state.name} (a resume must keep the backup's; "
                              f"the config says {plan.value(key)!r})")
        extra.update(self.ot_inputs.snapshot(attempt))
        config = run_dir / f"attempt-{attempt}" / "config.json"
        config.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(config, json.dumps(plan.derived(extra), indent=4) + "\n")
        plan.env.setdefault("PYTHONUNBUFFERED", "1")  # else stdout reaches the pipe only at exit
        self._attempt, self._resume_step = attempt, resume.step if resume else 0
        self.ot_output.begin(start_epoch, str(self.model_out))
        self.ot_inputs.launched(attempt)
        return Launch.of(plan, plan.launch_argv(config, set(plan.overrides) | set(extra)), resume)

    # --- remedies ------------------------------------------------------------------------------
    def rules(self) -> tuple[FaultRule, ...]:
        return RULES

    def ladder(self, fault: str, plan: Plan | None = None) -> tuple[Rung, ...]:
        return ladder(fault, plan if isinstance(plan, OTPlan) else self.plan)

    def apply(self, plan: Plan, action: Action, evidence: Said = NOTHING_SAID) -> str | None:
        assert isinstance(plan, OTPlan)
        nan_backup = None
        if action.kind == "add_flag" and action.name == LR:
            seen = self.ot_output.last_backup_step
            nan_backup = seen if seen is not None else self._resume_step
        change = apply_action(plan, action, evidence, nan_backup)
        if nan_backup is not None:
            plan.tainted_by = self._attempt  # the plan, not the session: a dry run's copy changes alone
        return change

    def python(self, env: Mapping[str, str]) -> str | None:
        return trainer_python(self.plan.argv[: self.plan.script_at], dict(env))

    def command_line(self, plan: Plan) -> list[str]:
        assert isinstance(plan, OTPlan)
        return plan.command_line()

    def plan_notes(self, plan: Plan) -> list[str]:
        assert isinstance(plan, OTPlan)
        return [f"{key} is changed in the derived config trainsup writes: without trainsup, set it in "
                f"{plan.config_path} or pass --config-value {key}=..." for key in plan.overrides]

    # --- doctor --------------------------------------------------------------------------------
    doctor_packages = ("bitsandbytes",)

    def doctor(self, env: Mapping[str, str]) -> list[Finding]:
        return doctor.check(self.plan, self.doctor_facts.versions)

    def state_size(self) -> tuple[float, str] | None:
        backup = self.workspace / "backup"
        for path in sorted(backup.iterdir(), reverse=True) if backup.is_dir() else []:
            if parse_name(path.name) is not None:
                size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
                return float(size), f"the size of {path}"
        return None


FAMILY = Family("onetrainer", "OneTrainer (python scripts/train.py --config-path CONFIG.json)",
                claim=lambda argv: NAMES_SCRIPT if find_script(list(argv)) is not None else NO_CLAIM,
                session=OneTrainerRun, output_format=OTOutput, family_rules=FAMILY_RULES)
