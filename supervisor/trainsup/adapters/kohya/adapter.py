"""Owns sd-scripts behind the trainer contract (and, told its ``Dialect``, musubi-tuner:
``adapters.musubi``): recognising its scripts, the first launch plan, the resume arguments and
output names of each attempt, the remedy ladders, and ``trainsup doctor``'s checks (``doctor``,
``doctor_checks``).

An attempt that resumes, or that starts over after an earlier attempt of this run wrote files,
writes under its own ``--output_name`` (``NAME-trainsupN``): kohya labels post-resume saves with
wrong step numbers and would otherwise overwrite earlier states and weights. The ledger maps every
state to its absolute step; the final weights are published where the user's command puts them.
A resumed attempt's step saves and step samples get cadences of its own (``exact``) whose labels
land on the user's true steps, and no ``--sample_at_first`` (an uninterrupted run has no sample at
the resume step); its samples are published under their true names (``samples``).
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping, Sequence
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
    Finding,
    Launch,
    Notice,
    OutputFormat,
    Plan,
    Samples,
    Say,
    Setup,
    TrainerRun,
)
from ...trainers.cmdline import TrainerCommand, find_script
from ...trainers.interpreter import trainer_python
from . import doctor as kohya_doctor
from .dialect import KOHYA, Dialect
from .doctor_checks import CommandView, load_view
from .exact import epoch_aligned
from .identity import identity_fields, outputs_under
from .inputs import KohyaInputs
from .output import BATCHES_PER_EPOCH, GRAD_ACCUM, KohyaOutput
from .plan import LaunchPlan, apply_action, upgrade_spec
from .points import Cadence, ResumePoints
from .prepare import prepare
from .profile import script_info, state_holds_step
from .remedies import ladder as kohya_ladder
from .rules import FAMILY_RULES, RUN_RULES
from .samples import SampleCadence

# sd-scripts: OUTPUT_DIR/sample/[NAME_]STEP6_II_TIMESTAMP[_SEED].png (epoch samples: eEPOCH6)
_SAMPLE_STEP = r"(\d{6})_\d{2}(?:_\d{14})?(?:_\d+)?\.png$"

# Telltale flags (the claim scale's TELLTALE, ``trainers.base``): a script no family names (a renamed
# copy of an sd-scripts script) that takes one of them is kohya's. Its own scripts, present and new,
# are claimed by name instead (``profile``'s script kinds), never by these.
_TELLTALE = ("--pretrained_model_name_or_path", "--network_module", "--dataset_config", "--train_data_dir")
# ...unless it also takes flags no sd-scripts script has: the diffusers and accelerate example
# scripts share the first two telltales but checkpoint with these (``--resume_from_checkpoint latest``).
_NOT_KOHYA = ("--checkpointing_steps", "--resume_from_checkpoint", "--checkpoints_total_limit",
              "--instance_data_dir", "--instance_prompt")


class KohyaRun(TrainerRun):
    family = "kohya"
    dialect: Dialect = KOHYA  # a variant of the trainer (musubi-tuner) names its own
    plan: LaunchPlan
    doctor_packages = kohya_doctor.PACKAGES

    def __init__(self, setup: Setup) -> None:
        super().__init__()
        p = prepare(list(setup.argv), setup.cwd, setup.settings, as_given=setup.as_given, dialect=self.dialect)
        self.prepared, self.plan = p, p.plan
        self.output_dir, self.total_steps, self.user_resume = p.output_dir, p.max_train_steps, p.user_resume
        self.notes = list(p.notes)
        config = self.plan.command.get("config_file")
        if setup.as_given and config and self.plan.user_config is None:
            self.settings_unknown = True
            self.notes.append(f"--config_file {config} is not readable here: flags set in it are unknown")
        self.cwd, self.settings = setup.cwd, setup.settings
        self.given = tuple(setup.argv)  # doctor judges the command as the user gave it
        self.output = self.kohya_output = KohyaOutput()

    @property
    def label(self) -> str | None:
        return self.prepared.output_name

    def identity(self) -> dict[str, Any]:
        given = prepare(list(self.given), self.cwd, self.settings, as_given=True)
        script = os.path.basename(given.plan.command.launcher[-1])
        return identity_fields(script, given.plan, self.cwd, self.output_dir)

    def existing_outputs(self) -> list[Path]:
        return outputs_under(self.output_dir or self.cwd, self.prepared.output_name)

    def samples(self) -> Samples | None:
        # Only the user's own name holds a true step: an attempt's own (NAME-trainsupN_...) is placed by
        # its time on the page until trainsup publishes it under the true name and moves it away.
        name = self.prepared.output_name
        return Samples(((self.output_dir or self.cwd) / "sample",), f"^{re.escape(f'{name}_' if name else '')}"
                       + _SAMPLE_STEP)

    def samples_record(self) -> dict[str, Any] | None:
        found = self.samples()  # the names it shows are true: the bar's resume offset is not added
        return None if found is None else found.record(absolute_steps=True)

    def bind(self, run_dir: Path, ledger: Ledger, journal: Journal, say: Say) -> None:
        fp16 = self.plan.value("mixed_precision") == "fp16"
        p = self.prepared
        ext = str(self.plan.value("save_model_as") or "safetensors")
        cadence = Cadence(p.max_train_steps, p.save_every_steps, p.user_epoch_every,
                          ext if ext in ("safetensors", "ckpt", "pt") else "safetensors",
                          self.dialect.exact_at_epoch_end and str(self.plan.value("save_every_n_epochs")) == "1")
        self.points = ResumePoints(ledger, self.output_dir or self.cwd, fp16, journal, say, p.output_name,
                                   cadence, run_dir, self._sample_cadence(), self.dialect, self.processes())
        self.points.epoch_seen = lambda: self.kohya_output.epoch_started
        self.states = self.points
        self.kohya_inputs = KohyaInputs(self.plan, self.cwd, run_dir, self.settings, journal, say)
        self.inputs = self.kohya_inputs

    def _sample_cadence(self) -> SampleCadence | None:
        """When the user's command samples (command line over --config_file), or None."""
        def number(flag: str) -> int | None:
            value = str(self.plan.value(flag) or "")
            return int(value) if value.isdigit() and int(value) > 0 else None  # kohya: <= 0 disables

        if not self.plan.value("sample_prompts"):
            return None
        return SampleCadence(number("sample_every_n_steps"), number("sample_every_n_epochs"),
                             self.plan.effective("sample_at_first"), self.total_steps or 0)

    def launch(self, plan: Plan, attempt: int, resume: StateRecord | None, run_dir: Path) -> Launch:
        assert isinstance(plan, LaunchPlan)
        cmd, name = plan.command, self.prepared.output_name
        # The user's own output name is safe only for a fresh start that nothing of this run has
        # written under yet; a resumed attempt's labels are wrong and would overwrite earlier files.
        starts_over = resume is None and self.user_resume is None
        if starts_over and self.dialect is KOHYA and not state_holds_step(os.path.basename(cmd.launcher[-1])):
            self.points.start_over(name, attempt)  # no state of its can resume: each attempt is the whole run
        own_name = starts_over and not self.points.wrote_under(name)
        output_name = name if own_name else f"{name or 'last'}-trainsup{attempt}"
        if output_name is not None and not own_name:
            cmd.set("output_name", output_name)
        skips = self.resume_flags(plan, resume)
        self.kohya_output.epoch_started = 0
        resume_step = resume.step if resume else 0
        saves = self.points.plan_attempt(attempt, resume_step, output_name, skips)
        never = str((self.total_steps or 0) + 1)  # past every label it counts (a --config_file's too)
        if not own_name:
            # Its labels run behind the true steps: a cadence whose saves land on the user's steps.
            if saves.every:
                cmd.set("save_every_n_steps", str(saves.every))
            elif saves.offset > 0:
                cmd.set("save_every_n_steps", never)
            else:
                cmd.remove("save_every_n_steps")
        if saves.sample_every is not None:  # likewise its step samples
            cmd.set("sample_every_n_steps", str(saves.sample_every) if saves.sample_every else never)
        if resume is not None:
            # It would sample at the resume step, which an uninterrupted run does not.
            cmd.remove("sample_at_first")
            if plan.config_value("sample_at_first") not in (None, False):
                plan.config_overlay_removed.add("sample_at_first")
        self.kohya_inputs.before_launch(attempt, plan)
        plan.write_derived_configs(run_dir, attempt)
        # Its labels: true steps from the beginning; from 0 at an epoch's end; mid-epoch, the summary tells.
        return Launch.of(plan, cmd.argv(), resume, output_name=output_name,
                         label_offset=0 if resume_step == 0 else None if skips else resume_step)

    def resume_flags(self, plan: LaunchPlan, resume: StateRecord | None) -> bool:
        """Set the flags that resume from ``resume`` (None: the beginning); whether the trainer skips
        to the step (sd-scripts' ``--skip_until_initial_step``: its labels then come from its summary)."""
        cmd = plan.command
        if resume is None:
            cmd.remove("resume")
            cmd.remove("initial_step")
            return True
        cmd.set("resume", resume.dir)
        cmd.set("initial_step", str(resume.step))
        # At an epoch's end kohya resumes exactly without skipping (its skip arithmetic is wrong
        # with gradient accumulation); mid-epoch, skipping at least keeps the epoch's position.
        skips = not epoch_aligned(resume.step, self.points.per_epoch())
        if skips:
            cmd.set("skip_until_initial_step")
        else:
            cmd.remove("skip_until_initial_step")
        return skips

    def processes(self) -> int:
        """How many processes write a state (one ``random_states_N.pkl`` each)."""
        return 1

    def ladder(self, fault: str, plan: Plan | None = None) -> tuple[Rung, ...]:
        return kohya_ladder(fault)

    def apply(self, plan: Plan, action: Action, evidence: Said = NOTHING_SAID) -> str | None:
        assert isinstance(plan, LaunchPlan)
        return apply_action(plan, action, evidence)

    def rules(self) -> tuple[FaultRule, ...]:
        return RUN_RULES

    def upgrade_spec(self, action: Action, evidence: Said) -> str:
        return upgrade_spec(action, evidence)

    def python(self, env: Mapping[str, str]) -> str | None:
        return trainer_python(self.plan.command.launcher, dict(env))

    def command_line(self, plan: Plan) -> list[str]:
        assert isinstance(plan, LaunchPlan)
        return plan.command.argv()

    def plan_notes(self, plan: Plan) -> list[str]:
        assert isinstance(plan, LaunchPlan)
        return [f"--{key} is set in {plan.user_config}: remove it there too "
                "(trainsup run writes a derived copy instead)" for key in sorted(plan.config_overlay_removed)]

    def on_summary(self, summary: Mapping[str, Any]) -> Notice | None:
        self.points.summary(summary.get(BATCHES_PER_EPOCH), summary.get(GRAD_ACCUM))
        return None

    @functools.cached_property
    def doctor_view(self) -> CommandView:
        """The flags and files as the trainer will see them (read once, for doctor)."""
        return load_view(TrainerCommand.parse(list(self.given)), self.cwd)

    def doctor(self, env: Mapping[str, str]) -> list[Finding]:
        return kohya_doctor.findings(self.doctor_view, self.doctor_facts)

    def state_size(self) -> tuple[float, str] | None:
        return kohya_doctor.state_size(self.doctor_view)


class KohyaFamily:
    name = "kohya"
    description = "kohya-ss sd-scripts (train_network.py, flux_train_network.py, ...)"

    def output(self) -> OutputFormat:
        """A fresh format of this trainer's output (``diagnose`` reads a log with every family's)."""
        return KohyaOutput()

    def rules(self) -> tuple[FaultRule, ...]:
        return FAMILY_RULES

    def ladder(self, fault: str) -> tuple[Rung, ...]:
        """The ladder needs no command: ``diagnose`` proposes it for a log read as this trainer's."""
        return kohya_ladder(fault)

    def detect(self, argv: Sequence[str]) -> int:
        try:
            at = find_script(list(argv))
        except ValueError:
            # `accelerate launch` with no script: kohya's launcher, missing its script (a usage error)
            launcher = [os.path.basename(a).removesuffix(".exe") for a in argv[:2]]
            return TELLTALE if launcher == ["accelerate", "launch"] else NO_CLAIM
        token = argv[at]
        script = os.path.basename(token)[:-3] if token.endswith(".py") else token.rsplit(".", 1)[-1]
        if script_info(script).kind != "unknown":
            return NAMES_SCRIPT
        flags = {a.split("=", 1)[0] for a in argv[at + 1:]}
        return TELLTALE if flags & set(_TELLTALE) and not flags & set(_NOT_KOHYA) else NO_CLAIM

    def open(self, setup: Setup) -> TrainerRun:
        return KohyaRun(setup)


FAMILY = KohyaFamily()
