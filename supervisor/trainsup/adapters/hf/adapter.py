"""Owns the Hugging Face Trainer family behind the trainer contract: recognising its commands, the
first plan, each attempt's resume, the ladders and doctor.

Claimed by name (``NAMES_SCRIPT``): ``trl sft|dpo|grpo|...`` (also ``python -m trl``), ``axolotl train``
(``python -m axolotl.cli.train``), ``llamafactory-cli train``. A script no family names (``accelerate
launch``/``torchrun``/``python`` of ``train.py``) is claimed as a telltale when its flags are
``TrainingArguments``' own: ``--output_dir`` with ``--save_steps``, or with ``--resume_from_checkpoint``
and another setting only the Trainer takes; never with a flag of sd-scripts or of the diffusers/accelerate
scripts (``--checkpointing_steps``), whose families claim those. A project's ``trainer: hf`` names it.

Every resumed attempt names its checkpoint explicitly (``--resume_from_checkpoint PATH``, or
``resume_from_checkpoint: PATH`` in a derived copy of a YAML front-end's config), after every folder past
it, complete or cut, was moved into the run dir: the Trainer's own "latest" takes the highest
``checkpoint-N`` unchecked. The Trainer resumes with true step numbers and its data order (bit-exact on the
bed), so nothing is counted here. A checkpoint at the run's last step is never resumed from (``states``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from ...faults.remedies import Action, Rung
from ...faults.rules import FaultRule
from ...faults.verdict import NOTHING_SAID, Said
from ...record.journal import Journal
from ...record.ledger import Ledger, StateRecord
from ...trainers.base import (
    NAMES_SCRIPT,
    NO_CLAIM,
    TELLTALE,
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
from ...trainers.stepstates import StepStates, newest_mtime, step_dirs
from .output import HfOutput, unknown_log_format
from .plan import FrontEnd, HfPlan, find_front_end, is_off, is_true, script_at
from .remedies import apply_action, ladder
from .rules import RULES
from .states import CHECKPOINT, SHARD_INDEXES, WEIGHTS, at_end, checkpoint_problem

RESUME = "resume_from_checkpoint"
AUTO_RESUME = "auto_resume_from_checkpoints"  # axolotl's own "latest"
# Where each front-end writes when its command names no output dir.
DEFAULT_OUT = {"trl": "trainer_output", "axolotl": "model-out"}
# Settings only ``TrainingArguments`` takes (no sd-scripts or diffusers script has them).
_TRAINER_ONLY = frozenset({"--save_steps", "--save_strategy", "--save_total_limit", "--per_device_train_batch_size",
                           "--logging_steps", "--eval_strategy", "--evaluation_strategy", "--save_only_model",
                           "--per_device_eval_batch_size", "--logging_strategy", "--load_best_model_at_end"})
# Flags of the families beside this one: sd-scripts, and the diffusers/accelerate checkpoint-N scripts.
_OTHERS = frozenset({"--checkpointing_steps", "--checkpoints_total_limit", "--save_every_n_steps",
                     "--network_module", "--dataset_config", "--save_every_n_epochs", "--max_train_steps",
                     "--instance_data_dir", "--instance_prompt"})


def _flag_names(tokens: Sequence[str]) -> set[str]:
    return {"--" + t[2:].split("=", 1)[0].replace("-", "_") for t in tokens if t.startswith("--")}


def detect(argv: Sequence[str]) -> int:
    args = list(argv)
    if find_front_end(args) is not None:
        return NAMES_SCRIPT
    at = script_at(args)
    if at is None:
        return NO_CLAIM
    flags = _flag_names(args[at + 1:])
    if "--output_dir" not in flags or flags & _OTHERS:
        return NO_CLAIM
    if "--save_steps" in flags or ("--resume_from_checkpoint" in flags and flags & _TRAINER_ONLY):
        return TELLTALE
    return NO_CLAIM


class HfStates(StepStates):
    """The ``checkpoint-N`` folders of the output dir; never one at the run's last step as a resume point."""

    def resumable(self, state: StateRecord, max_steps: int | None, plan: Plan | None = None) -> bool:
        return not at_end(Path(state.dir)) and (max_steps is None or state.step < max_steps)


class HfRun(TrainerRun):
    family = "hf"
    plan: HfPlan
    doctor_packages = ("transformers",)

    def __init__(self, setup: Setup) -> None:
        super().__init__()
        argv = list(setup.argv)
        named = find_front_end(argv)
        found: tuple[FrontEnd, int]
        if named is not None:
            found = named
        else:
            at = script_at(argv)
            if at is None:
                raise UsageError("not a Hugging Face Trainer command: expected `trl SUBCOMMAND ...`, `axolotl train "
                                 "CFG.yml`, `llamafactory-cli train CFG.yaml` or a training script (*.py)")
            found = ("script", at)
        self.cwd = setup.cwd
        self.plan = HfPlan.parse(argv, found[0], found[1], setup.cwd)
        try:
            self.plan.load_config()
        except (OSError, ValueError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            if not setup.as_given:
                raise UsageError(f"{self.plan.config_path()}: cannot read the config: {reason}") from None
            self.settings_unknown = True
            self.notes.append(f"{self.plan.config_path()} is not readable here: the settings in it are unknown")
        try:
            total = self.plan.get_int("max_steps")
            for name in ("save_steps", "per_device_train_batch_size", "gradient_accumulation_steps"):
                self.plan.get_int(name)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        self.total_steps = total if total is not None and total > 0 else None  # -1: limited by epochs
        self.output_dir = self.out = self._out_dir(setup.as_given)
        self.hf_output = HfOutput()
        self.output = self.hf_output
        self._resume_setting()

    def _out_dir(self, as_given: bool) -> Path:
        given = self.plan.value("output_dir") or DEFAULT_OUT.get(self.plan.front_end)
        if not given:
            if as_given:
                self.settings_unknown = True
                return self.cwd
            raise UsageError("the command names no output_dir (a --output_dir flag, or output_dir: in its YAML): "
                             "the Trainer's checkpoints go there, and trainsup resumes from them")
        path = Path(str(given)).expanduser()
        return Path(os.path.normpath(path if path.is_absolute() else self.cwd / path))

    def checkpoints(self) -> list[tuple[Path, int]]:
        return step_dirs(self.out, CHECKPOINT)

    def _resume_setting(self) -> None:
        """The user's own resume: an explicit checkpoint (adopted by the engine), or the Trainer's
        unchecked "latest" replaced by the newest complete checkpoint; never one at the last step."""
        given = self.plan.value(RESUME)
        latest = is_true(given) or (self.plan.front_end == "axolotl" and is_true(self.plan.value(AUTO_RESUME)))
        if is_off(given) and not latest:
            return
        if latest:
            newest = next((p for p, _ in reversed(self.checkpoints()) if not checkpoint_problem(p)), None)
            if newest is None:
                self.notes.append(f"{RESUME} {given}: {self.out} holds no complete checkpoint; trainsup starts "
                                  "from the beginning")
                return
            self.notes.append(f"{RESUME} {given}: trainsup resumes from {newest} (the newest complete checkpoint) "
                              "and names it; the Trainer's own choice takes the newest folder unchecked")
            path = newest
        else:
            path = Path(str(given)).expanduser()
            path = Path(os.path.normpath(path if path.is_absolute() else self.cwd / path))
        if at_end(path) and not checkpoint_problem(path):
            raise UsageError(f"{path} is the run's last step (its trainer_state.json: global_step = max_steps): "
                             "the run is finished, and the Trainer resumed from it would train one step more; "
                             "nothing is launched")
        self.user_resume = path

    def bind(self, run_dir: Path, ledger: Ledger, journal: Journal, say: Say) -> None:
        self.step_states = HfStates(ledger, journal, say, self.checkpoints, checkpoint_problem, publish=self._final)
        self.states = self.step_states

    def _final(self) -> str | None:
        """The final model the Trainer's ``save_model`` wrote at the top of the output dir during this
        run, for the run's end to name (exit 0 alone is success: not every script saves one)."""
        started = self.step_states.ledger.run_started() or 0.0
        for name in WEIGHTS + SHARD_INDEXES:
            path = self.out / name
            if path.is_file() and newest_mtime(path) >= int(started):
                return str(path)
        return None

    def existing_outputs(self) -> list[Path]:
        found = [p for p, _ in self.checkpoints()]
        return found + [self.out / name for name in WEIGHTS if (self.out / name).is_file()]

    # --- launching -----------------------------------------------------------------------------
    def launch(self, plan: Plan, attempt: int, resume: StateRecord | None, run_dir: Path) -> Launch:
        assert isinstance(plan, HfPlan)
        if resume is not None:
            self.step_states.set_aside_after(resume.step, run_dir, attempt)
            plan.set(RESUME, resume.dir)
        else:
            if attempt > 1:
                self.step_states.set_aside_after(0, run_dir, attempt)  # what earlier attempts left
            if not is_off(plan.value(RESUME)):
                plan.unset(RESUME)
        if plan.front_end == "axolotl" and is_true(plan.value(AUTO_RESUME)):
            plan.set(AUTO_RESUME, False)  # the checkpoint is named, or there is none to take
        try:
            total = plan.get_int("max_steps")
        except ValueError:
            total = None
        self.hf_output.begin(total if total is not None and total > 0 else None)
        return Launch.of(plan, plan.argv(run_dir, attempt), resume)

    # --- remedies ------------------------------------------------------------------------------
    def rules(self) -> tuple[FaultRule, ...]:
        return RULES

    def ladder(self, fault: str, plan: Plan | None = None) -> tuple[Rung, ...]:
        return ladder(fault, plan if isinstance(plan, HfPlan) else self.plan)

    def apply(self, plan: Plan, action: Action, evidence: Said = NOTHING_SAID) -> str | None:
        assert isinstance(plan, HfPlan)
        return apply_action(plan, action, evidence)

    def python(self, env: Mapping[str, str]) -> str | None:
        return trainer_python(self.plan.command.launcher, dict(env))

    def command_line(self, plan: Plan) -> list[str]:
        assert isinstance(plan, HfPlan)
        return plan.argv()

    def plan_notes(self, plan: Plan) -> list[str]:
        assert isinstance(plan, HfPlan)
        return [f"{key} is set in {plan.config_path()}: change it there too (trainsup run writes a derived copy)"
                for key in plan.yaml_edits if key != RESUME]

    # --- doctor --------------------------------------------------------------------------------
    def doctor(self, env: Mapping[str, str]) -> list[Finding]:
        found: list[Finding] = []
        where = self.out if self.out.exists() else next((p for p in self.out.parents if p.exists()), None)
        if where is None or not os.access(where, os.W_OK | os.X_OK):
            found.append(Finding("blocker", "output_dir", f"{self.out} cannot be written (the checkpoints go there)",
                                 "give an output_dir this user can write"))
        if self.user_resume is not None:
            problem = checkpoint_problem(self.user_resume)
            if problem:
                found.append(Finding("blocker", "resume", f"{RESUME} {self.user_resume}: {problem}",
                                     "name a complete checkpoint-N folder, or leave the flag out"))
        torch = self.doctor_facts.versions.get("torch")
        bf16 = self.plan.value("bf16")
        bf16_on = bf16 is None or not is_off(bf16)  # TRL's default is on
        cpu_only = bool(torch) and "+cpu" in str(torch) and not is_true(self.plan.value("use_cpu"))
        if self.plan.front_end == "trl" and cpu_only and bf16_on:
            found.append(Finding("warning", "bf16_cpu", f"TRL turns bf16 on by default and this torch ({torch}) has no "
                                 "GPU: the Trainer stops with \"Your setup doesn't support bf16/gpu\" (trainsup run "
                                 "then relaunches with --bf16 false)", "add --bf16 false (or --use_cpu true)"))
        return found


FAMILY = Family("hf", "Hugging Face Trainer (trl sft|dpo|grpo|..., axolotl train, llamafactory-cli train, "
                "a script with TrainingArguments): checkpoint-N folders", claim=detect, session=HfRun,
                output_format=unknown_log_format, family_rules=RULES)
