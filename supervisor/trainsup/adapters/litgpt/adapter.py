"""Owns LitGPT behind the trainer contract: recognising ``litgpt finetune_lora|finetune|finetune_full|
finetune_adapter|finetune_adapter_v2|pretrain ...`` (the console script, any path to it, or
``python -m litgpt``), the first plan, each attempt's resume arguments and out dir, the ladders.

Each attempt either resumes (``finetune_full``, ``pretrain``): ``--resume`` names the newest
*complete* state's weights file, after every folder past it was moved into the run dir; or starts
from the beginning: into ``--out_dir`` while nothing there would be overwritten, else into an out
dir of its own (``states``). A user's ``--resume auto``/``true`` is replaced by the explicit path of
the newest complete state, or removed when there is none: LitGPT's own choice takes the newest
folder unchecked. A remedy of the LR schedule (which LitGPT restores from a state) forces a fresh
start: states carry the schedule generation of the plan that saved them, and only states of the
current generation are resumed from.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from ...faults.remedies import Action, Rung
from ...faults.rules import FaultRule
from ...faults.verdict import NOTHING_SAID, Said
from ...record.journal import Journal
from ...record.ledger import Ledger, StateRecord
from ...trainers.base import (
    NAMES_SCRIPT,
    NO_CLAIM,
    Family,
    Finding,
    Launch,
    Plan,
    Say,
    Setup,
    TrainerRun,
    UsageError,
)
from ...trainers.interpreter import trainer_python
from . import doctor
from .configfile import ConfigFile
from .methods import METHODS, Method
from .output import LitOutput
from .plan import LitPlan, find_subcommand
from .remedies import apply_action, ladder
from .rules import FAMILY_RULES, RUN_RULES
from .states import LitStates, state_problem, step_folders

_OFF = (None, "false", "False", "null", "None")  # --resume values that mean no resume
_NEWEST = ("auto", "true", "True")  # LitGPT's own pick of the newest step folder, unchecked


class LitgptRun(TrainerRun):
    family = "litgpt"
    plan: LitPlan

    def __init__(self, setup: Setup) -> None:
        super().__init__()
        argv = list(setup.argv)
        at = find_subcommand(argv)
        if at is None:
            raise UsageError("not a LitGPT training command: expected `litgpt SUBCOMMAND ...` or "
                             f"`python -m litgpt SUBCOMMAND ...` with SUBCOMMAND one of {', '.join(sorted(METHODS))}")
        self.method: Method = METHODS[argv[at]]
        self.cwd = setup.cwd
        self.plan = LitPlan.parse(argv, at, self.method, setup.cwd)
        self._load_configs(setup.as_given)
        try:
            self.total_steps = self.plan.get_int("train.max_steps")
            for key in ("train.save_interval", "train.log_interval", "train.micro_batch_size",
                        "train.global_batch_size", "train.lr_warmup_steps", "train.max_seq_length"):
                self.plan.get_int(key)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if self.method.resume == "path" and not setup.as_given:
            self._ensure_states(setup.settings.save_every_n_steps)
        self.output_dir = self.out = self._out_dir()
        self.lit_output = LitOutput()
        self.output = self.lit_output
        self._launched_gen = 0  # the schedule generation of the plan launched last
        self._attempt_gen: dict[int, int] = {}
        self._say: Say = lambda _m: None
        self._resume_setting()
        if self.method.resume == "none":
            self.notes.append(f"{self.method.why_no_resume}: after a fault trainsup restarts it from the beginning "
                              "with the corrected flags; once --out_dir holds step folders, into an out dir of its "
                              "own (RUN_DIR/attempt-N-out: LitGPT would overwrite them in place), publishing its "
                              f"final/ to {self.out / 'final'}")

    def _ensure_states(self, every: int | None) -> None:
        """A resumable method whose run saves no state before its end gets a save interval: without
        states a restart has nothing to continue from (LitGPT's default interval is 1000 steps)."""
        total = self.total_steps
        if total is None or total < 2 or self.plan.value("train.save_interval") is not None \
                or self.method.save_interval < total:
            return
        every = every or max(1, total // 10)
        if every >= total:
            return
        self.plan.set("train.save_interval", str(every))
        self.notes.append(f"--train.save_interval {every} added: LitGPT's default ({self.method.save_interval}) saves "
                          f"no state in a {total}-step run, and without states a restart has nothing to resume from")

    def _load_configs(self, as_given: bool) -> None:
        for given in self.plan.config_paths():
            path = self.plan.resolve(given)
            try:
                self.plan.configs[given] = ConfigFile.load(path)
            except (OSError, ValueError) as exc:
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                if not as_given:
                    raise UsageError(f"--config {given}: cannot read {path}: {reason}") from None
                self.settings_unknown = True
                self.notes.append(f"--config {given} is not readable here: settings in it are unknown")

    def _out_dir(self) -> Path:
        given = self.plan.value("out_dir") or self.method.default_out
        path = Path(given).expanduser()
        artifacts = os.environ.get("LIGHTNING_ARTIFACTS_DIR")  # litgpt's init_out_dir honours it
        if not path.is_absolute() and artifacts:
            path = Path(artifacts) / path
        return Path(os.path.normpath(self.cwd / path))

    def _resume_setting(self) -> None:
        """The user's own --resume: an explicit state (adopted by the engine), or LitGPT's unchecked
        `auto`/`true` replaced by the newest complete state, or nothing to resume."""
        given = self.plan.value("resume")
        if given in _OFF:
            return
        if self.method.resume == "none":
            self.notes.append(f"--resume {given} is removed: {self.method.why_no_resume}")
            return
        if given in _NEWEST:
            newest = next((p for p, _ in reversed(step_folders(self.out)) if not state_problem(p, self.method)), None)
            if newest is None:
                self.notes.append(f"--resume {given}: {self.out} holds no complete state; trainsup starts from the "
                                  "beginning and removes --resume")
                return
            self.user_resume = newest
            self.notes.append(f"--resume {given}: trainsup resumes from {newest} (the newest complete state) and "
                              "passes its path; LitGPT's own choice would take the newest folder unchecked")
            return
        path = Path(os.path.normpath(self.plan.resolve(given)))
        self.user_resume = path.parent if path.name == self.method.weights or path.is_file() else path

    def bind(self, run_dir: Path, ledger: Ledger, journal: Journal, say: Say) -> None:
        self._say = say
        self.lit_states = LitStates(ledger, journal, say, self.method, self.out, run_dir, self._resumable)
        self.states = self.lit_states

    def _resumable(self, state: StateRecord, plan: Plan | None) -> bool:
        # Only a state saved under the LR schedule the launch of ``plan`` asks for (LitGPT restores the
        # schedule from it); attempts of an earlier supervisor ran the user's plan, generation 0.
        gen = plan.schedule_gen if isinstance(plan, LitPlan) else self._launched_gen
        return self._attempt_gen.get(state.attempt, 0) == gen

    # --- launching -----------------------------------------------------------------------------
    def launch(self, plan: Plan, attempt: int, resume: StateRecord | None, run_dir: Path) -> Launch:
        assert isinstance(plan, LitPlan)
        states = self.lit_states
        if resume is not None and self.method.resume == "path":
            state = Path(resume.dir)
            out = state.parent
            states.set_aside_after(resume.step, run_dir, attempt, within=out)
            plan.set("resume", str(state / self.method.weights))
        else:
            resume = None
            if plan.value("resume") not in _OFF:
                plan.unset("resume")
            out = self.out if states.clear(self.out) else states.attempt_out(attempt)
            if out != self.out:
                self._say(f"attempt {attempt} starts from the beginning in {out}: {self.out} holds step folders "
                          "or final/ of an earlier attempt, which LitGPT would overwrite")
        if out != self.out:
            plan.set("out_dir", str(out))
        states.current_out = out
        self._attempt_gen[attempt] = self._launched_gen = plan.schedule_gen
        self._begin_output(plan)
        plan.write_derived_configs(run_dir, attempt)
        return Launch.of(plan, plan.argv(), resume)

    def _begin_output(self, plan: LitPlan) -> None:
        try:
            micro = plan.get_int("train.micro_batch_size", self.method.micro_batch_size) or 1
            glob = plan.get_int("train.global_batch_size", self.method.global_batch_size) or micro
            devices = plan.value("devices") or self.method.devices
            per_device = glob // (int(devices) if devices.isdigit() and int(devices) > 0 else 1)
            log_interval = plan.get_int("train.log_interval", 1)
            self.lit_output.begin(plan.get_int("train.max_steps"), plan.get_int("train.save_interval", 1000),
                                  per_device // micro, log_interval == 1 or self.method.saving_line)
        except ValueError:
            self.lit_output.begin(None, None, 1, False)  # unreadable numbers: look on disk instead

    # --- remedies ------------------------------------------------------------------------------
    def rules(self) -> tuple[FaultRule, ...]:
        return RUN_RULES

    def ladder(self, fault: str, plan: Plan | None = None) -> tuple[Rung, ...]:
        return ladder(fault, plan if isinstance(plan, LitPlan) else self.plan)

    def apply(self, plan: Plan, action: Action, evidence: Said = NOTHING_SAID) -> str | None:
        assert isinstance(plan, LitPlan)
        return apply_action(plan, action, evidence)

    def python(self, env: Mapping[str, str]) -> str | None:
        return trainer_python(self.plan.launcher_head, dict(env))

    def command_line(self, plan: Plan) -> list[str]:
        assert isinstance(plan, LitPlan)
        return plan.argv()

    def plan_notes(self, plan: Plan) -> list[str]:
        assert isinstance(plan, LitPlan)
        return [f"--{key} is set in {cfg.path}: change it there too (trainsup run writes a derived copy instead)"
                for cfg in plan.configs.values() for key in cfg.overrides]

    # --- doctor --------------------------------------------------------------------------------
    def doctor(self, env: Mapping[str, str]) -> list[Finding]:
        return doctor.check(self.plan)

    def state_size(self) -> tuple[float, str] | None:
        if self.method.resume != "path" or self.method.positional != "checkpoint_dir":
            return None
        given = self.plan.positional()
        weights = self.plan.resolve(given) / "lit_model.pth" if given else None
        try:
            size = weights.stat().st_size if weights is not None else 0
        except OSError:
            return None
        # model + AdamW's two moments (the bed: a 671 KB model saved 2.0 MB states)
        return 3.0 * size, f"3 x {weights} (the weights and AdamW's two moments)"


FAMILY = Family("litgpt", "LitGPT (litgpt finetune_lora, finetune_full, finetune_adapter[_v2], pretrain)",
                claim=lambda argv: NAMES_SCRIPT if find_subcommand(list(argv)) is not None else NO_CLAIM,
                session=LitgptRun, output_format=LitOutput, family_rules=FAMILY_RULES)
