"""Owns the diffusers example scripts behind the trainer contract: recognising them, the first plan
(what trainsup adds to the user's command and why), each attempt's resume arguments, the remedies.

Claimed: ``accelerate launch``/``python`` of a diffusers example script by its name
(``train_dreambooth_lora.py``, ``train_text_to_image_lora.py``, ``textual_inversion.py``, ...), or of
any script with the accelerate checkpoint flags no other trainer takes (``--checkpointing_steps``,
``--checkpoints_total_limit``, ``--resume_from_checkpoint latest``); a project's ``trainer: diffusers``
names it outright.

Each attempt resumes with ``--resume_from_checkpoint checkpoint-N``, the chosen complete checkpoint's
name (the script looks for it under ``--output_dir``), after every checkpoint past it (complete or cut
short) was moved into the run dir; a fresh attempt runs without the flag. The user's own ``latest`` is
taken as the newest *complete* checkpoint; a run whose newest checkpoint is at ``--max_train_steps``
is finished and never resumed (the script would train one step more and write over its final
weights). ``--checkpoints_total_limit 1`` is raised to 2: the script deletes the old checkpoint
*before* it saves the new one, so a kill inside that save would leave nothing to resume from.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
from ...trainers.cmdline import TrainerCommand, find_script
from ...trainers.interpreter import trainer_python
from . import doctor
from .output import DiffusersOutput, steps_per_epoch
from .remedies import apply_action, ladder
from .rules import FAMILY_RULES
from .states import DiffusersStates, checkpoints, state_problem

# The example scripts of huggingface/diffusers (examples/*/ and examples/research_projects/*/) and
# the trainers named after them; no sd-scripts or musubi-tuner script has such a name.
SCRIPT_NAME = re.compile(
    r"(train_(dreambooth|text_to_image|controlnet|instruct_pix2pix|custom_diffusion|t2i_adapter|lcm_distill"
    r"|unconditional|amused|cogvideox|cogview4|wuerstchen|prior|decoder|diffusion_dpo|diffusion_orpo|realfill"
    r"|consistency_distillation)\w*|textual_inversion\w*)")
# Flags of the accelerate checkpoint-N loop that only these scripts take (the Hugging Face Trainer's are
# --save_steps/--save_total_limit, sd-scripts' --save_every_n_steps).
TELLTALES = ("--checkpointing_steps", "--checkpoints_total_limit")
FINAL_FILES = ("pytorch_lora_weights.safetensors", "model_index.json", "diffusion_pytorch_model.safetensors",
               "learned_embeds.safetensors")
DEFAULT_CHECKPOINTING_STEPS = 500  # every example script's default


def _script_at(argv: Sequence[str]) -> int | None:
    try:
        return find_script(list(argv))
    except ValueError:
        return None


def detect(argv: Sequence[str]) -> int:
    at = _script_at(argv)
    if at is None:
        return NO_CLAIM
    token = argv[at]
    name = os.path.basename(token)[:-3] if token.endswith(".py") else token.rsplit(".", 1)[-1]
    if SCRIPT_NAME.fullmatch(name):
        return NAMES_SCRIPT
    flags = [a.split("=", 1)[0] for a in argv[at + 1:]]
    resume = TrainerCommand.parse(list(argv), at).get("resume_from_checkpoint")
    if set(flags) & set(TELLTALES) or resume == "latest":
        return TELLTALE
    return NO_CLAIM


def _processes(launcher: list[str]) -> int:
    """The processes the launcher starts (each writes its own random_states_<i>.pkl)."""
    for i, token in enumerate(launcher):
        name, eq, value = token.partition("=")
        if name in ("--num_processes", "--nproc_per_node", "--nproc-per-node"):
            value = value if eq else (launcher[i + 1] if i + 1 < len(launcher) else "")
            if value.isdigit() and int(value) > 0:
                return int(value)
    return 1


@dataclass
class DiffusersPlan(Plan):
    command: TrainerCommand
    env: dict[str, str] = field(default_factory=dict)

    def copy(self) -> DiffusersPlan:
        return DiffusersPlan(self.command.copy(), dict(self.env))


class DiffusersRun(TrainerRun):
    family = "diffusers"
    plan: DiffusersPlan
    doctor_packages = ("diffusers", "accelerate")

    def __init__(self, setup: Setup) -> None:
        super().__init__()
        try:
            cmd = TrainerCommand.parse(list(setup.argv))
            self.total_steps = cmd.get_int("max_train_steps")
            every = cmd.get_int("checkpointing_steps")
            limit = cmd.get_int("checkpoints_total_limit")
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        out = cmd.get("output_dir")
        if not out:
            raise UsageError("--output_dir: trainsup needs it given (each diffusers script has its own default), "
                             "to find the checkpoint-N folders it resumes from")
        self.cwd = setup.cwd
        self.output_dir = self.out = Path(os.path.normpath(setup.cwd / Path(out).expanduser()))
        self.processes = _processes(cmd.launcher)
        self.launcher_precision = any(t.split("=", 1)[0] == "--mixed_precision" for t in cmd.launcher)
        self.plan = DiffusersPlan(cmd)
        self.given_resume = cmd.get("resume_from_checkpoint")
        self.output = DiffusersOutput()
        if not setup.as_given:
            every = self._ensure_checkpoints(every, setup.settings.save_every_n_steps)
            self._raise_limit(limit)
            self._resume_setting()
        self.every = every or DEFAULT_CHECKPOINTING_STEPS
        self.step_states: DiffusersStates | None = None

    # --- the first plan ------------------------------------------------------------------------
    def _ensure_checkpoints(self, every: int | None, wanted: int | None) -> int | None:
        """A run that would save no checkpoint before its end gets a cadence: without one a restart has
        nothing to resume from (the scripts' default is every 500 steps)."""
        total = self.total_steps
        if total is None or total < 2 or (every or DEFAULT_CHECKPOINTING_STEPS) < total:
            return every
        new = wanted or max(1, total // 10)
        if new >= total:
            return every
        self.plan.command.set("checkpointing_steps", str(new))
        self.notes.append(f"--checkpointing_steps {new} set: the run's {total} steps would save no checkpoint "
                          "before the end, and without one a restart has nothing to resume from")
        return new

    def _raise_limit(self, limit: int | None) -> None:
        if limit is not None and limit <= 1:
            self.plan.command.set("checkpoints_total_limit", "2")
            self.notes.append(f"--checkpoints_total_limit {limit} raised to 2: the script deletes the old "
                              "checkpoint before it writes the new one, so a fault inside that save would leave "
                              "no checkpoint to resume from; one more checkpoint stays on disk")

    def _finished(self, newest_step: int) -> bool:
        return self.total_steps is not None and newest_step >= self.total_steps

    def _resume_setting(self) -> None:
        """The user's own --resume_from_checkpoint: ``latest`` becomes the newest *complete* checkpoint
        (the script's own pick takes the highest name unchecked); a name or path is the checkpoint of
        that name under --output_dir (the script uses only the last component)."""
        given = self.given_resume
        if given is None:
            return
        if given != "latest":
            self.user_resume = self.out / Path(given).name
            return
        found = checkpoints(self.out)
        newest = next(((p, s) for p, s in reversed(found) if not state_problem(p, self.processes)), None)
        if newest is None:
            self.notes.append(f"--resume_from_checkpoint latest: {self.out} holds no complete checkpoint; "
                              "the run starts from the beginning")
            return
        path, step = newest
        if self._finished(step):
            if not (self.out / ".trainsup").is_dir():  # no run of trainsup's here to tell it
                raise UsageError(f"--resume_from_checkpoint latest: {path} is at --max_train_steps "
                                 f"{self.total_steps}: this run is finished. Resuming it would train one step "
                                 "more and write over its final weights, so nothing is trained; raise "
                                 "--max_train_steps to train on")
            return
        self.user_resume = path
        skipped = [p.name for p, s in found if s > step]
        why = f" ({', '.join(skipped)} not complete: set aside at launch)" if skipped else ""
        self.notes.append(f"--resume_from_checkpoint latest: trainsup resumes from {path.name}, the newest complete "
                          f"checkpoint{why}, and passes its name")

    # --- the contract ----------------------------------------------------------------------------
    def identity(self) -> dict[str, Any]:
        """The command without --resume_from_checkpoint: adding ``latest`` to resume the same run keeps
        it the same run (its run dir, its ledger, and, once finished, nothing trained again)."""
        cmd = TrainerCommand.parse(list(self.given_argv)) if self.given_argv else self.plan.command.copy()
        cmd.remove("resume_from_checkpoint")
        return {"trainer": self.family, "command": cmd.argv()}

    def bind(self, run_dir: Path, ledger: Ledger, journal: Journal, say: Say) -> None:
        self.step_states = DiffusersStates(ledger, journal, say, self.out, self.processes, self.every,
                                           publish=self._final)
        self.states = self.step_states

    def _final(self) -> str | None:
        """The final weights the script wrote into --output_dir, for the journal and the last line."""
        return next((str(self.out / f) for f in FINAL_FILES if (self.out / f).exists()), None)

    def existing_outputs(self) -> list[Path]:
        found = [p for p, _s in checkpoints(self.out)]
        return found + [self.out / f for f in FINAL_FILES if (self.out / f).exists()]

    def launch(self, plan: Plan, attempt: int, resume: StateRecord | None, run_dir: Path) -> Launch:
        assert isinstance(plan, DiffusersPlan)
        states = self.step_states
        if resume is not None:
            if states is not None:
                states.set_aside_after(resume.step, run_dir, attempt, within=self.out)
            plan.command.set("resume_from_checkpoint", Path(resume.dir).name)
        else:
            plan.command.remove("resume_from_checkpoint")
            if states is not None and attempt > 1:
                states.set_aside_after(0, run_dir, attempt, within=self.out)  # what earlier attempts wrote
        return Launch.of(plan, plan.command.argv(), resume)

    def on_summary(self, summary: Mapping[str, Any]) -> None:
        per_epoch = steps_per_epoch({k: v for k, v in summary.items() if isinstance(v, int)})
        if per_epoch and self.step_states is not None and self.step_states.ledger.attempts:
            self.step_states.note_per_epoch(per_epoch)

    def rules(self) -> tuple[FaultRule, ...]:
        return FAMILY_RULES

    def ladder(self, fault: str, plan: Plan | None = None) -> tuple[Rung, ...]:
        return ladder(fault)

    def apply(self, plan: Plan, action: Action, evidence: Said = NOTHING_SAID) -> str | None:
        assert isinstance(plan, DiffusersPlan)
        return apply_action(plan.command, plan.env, action, self.launcher_precision)

    def python(self, env: Mapping[str, str]) -> str | None:
        return trainer_python(self.plan.command.launcher, dict(env))

    def command_line(self, plan: Plan) -> list[str]:
        assert isinstance(plan, DiffusersPlan)
        return plan.command.argv()

    def doctor(self, env: Mapping[str, str]) -> list[Finding]:
        return doctor.check(self.plan.command, self.out, self.total_steps, self.given_resume)


FAMILY = Family("diffusers", "diffusers' example scripts and look-alikes (accelerate checkpoint-N: "
                "train_dreambooth_lora.py, train_text_to_image_lora.py, ...)",
                claim=detect, session=DiffusersRun, output_format=DiffusersOutput, family_rules=FAMILY_RULES)
