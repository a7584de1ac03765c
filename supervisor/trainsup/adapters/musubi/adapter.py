"""Owns musubi-tuner behind the trainer contract: the sd-scripts adapter (``KohyaRun``) told musubi's
``Dialect``, with what musubi does differently on a resume, and its own ladders, rules and doctor.

A resume is ``--resume STATE`` and ``--max_train_steps`` the steps left (never ``--initial_step``,
which musubi does not have): musubi counts its steps and epochs from 0 again and trains exactly that
many, so the attempt's labels run behind the true steps by the resume step (its bar too). A
``--max_train_epochs`` run is resumed by steps as well: the epochs times the optimizer steps per epoch
its start-up summary gave (musubi's own arithmetic), less the resume step. Every attempt after the
first writes under its own ``--output_name`` (``NAME-trainsupN``; musubi would rewrite
``NAME-step00000005...`` in place, the state it resumed from included); its saves and samples are
published under their true names and the final weights where the user's command puts them.

A launch whose dataset settings differ from the ones the user's caches were made from in what only the
latent caching reads (the memory remedy's lower resolution, an accepted resolution edit) trains on
latents made again in the run dir, by musubi's own caching script run first (``recache``).
"""

from __future__ import annotations

import dataclasses
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
    Finding,
    Launch,
    Notice,
    OutputFormat,
    Plan,
    Samples,
    Say,
    Setup,
    TrainerRun,
    UsageError,
)
from ...trainers.cmdline import find_script
from ..kohya import tomlio
from ..kohya.adapter import KohyaRun
from ..kohya.identity import identity_fields
from ..kohya.plan import LaunchPlan
from ..kohya.prepare import prepare
from . import caches, recache
from . import doctor as musubi_doctor
from .inputs import MusubiInputs
from .output import TOTAL_STEPS, MusubiOutput
from .profile import MUSUBI, is_training_script
from .remedies import ladder as musubi_ladder
from .rules import FAMILY_RULES, RUN_RULES

# OUTPUT_DIR/sample/NAME_STEP6_II_TIMESTAMP[_SEED]_NNN.png (an image; NNN: its place in the grid), or
# NAME_STEP6_II_TIMESTAMP[_SEED].mp4 (a video)
_SAMPLE_STEP = r"(\d{6})_\d{2}(?:_\d{14})?(?:_\d+)?(?:_\d{3}\.png|\.png|\.mp4)$"
# What shapes the weights (``record.identity``), as the user gave it.
SHAPING = ("task", "dit", "network_module", "network_dim", "network_alpha", "network_args", "network_weights",
           "optimizer_type", "optimizer_args", "learning_rate", "lr_scheduler", "max_train_steps",
           "max_train_epochs", "gradient_accumulation_steps", "timestep_sampling", "discrete_flow_shift",
           "seed", "output_name")


def _resolve(value: object, cwd: Path) -> Path | None:
    if not isinstance(value, str) or not value:
        return None
    p = Path(value).expanduser()
    return p if p.is_absolute() else cwd / p


def media_dirs(plan: LaunchPlan, cwd: Path) -> list[Path]:
    """The image and video folders of the dataset TOML (``[[datasets]]`` ``image_directory``,
    ``video_directory``), or the TOML itself when it cannot be read."""
    dataset = _resolve(plan.value("dataset_config"), cwd)
    if dataset is None:
        return []
    try:
        doc = tomlio.read_toml(dataset)
    except (tomlio.ConfigFileError, OSError):
        return [dataset]
    dirs = [_resolve(ds.get(key), cwd) for ds in musubi_doctor.datasets(doc)
            for key in ("image_directory", "video_directory")]
    return [d for d in dirs if d is not None] or [dataset]


class MusubiRun(KohyaRun):
    family = "musubi"
    dialect = MUSUBI

    def __init__(self, setup: Setup) -> None:
        super().__init__(setup)
        self.output = self.kohya_output = MusubiOutput()
        if not setup.as_given and not self.prepared.output_name:
            raise UsageError("--output_name is required: without it musubi-tuner trains to the end and then "
                             "fails at its final save, leaving no final weights (add --output_name NAME)")
        epochs = self.plan.value("max_train_epochs")
        try:
            self.epochs = int(str(epochs)) if epochs is not None else None
        except ValueError:
            raise UsageError(f"--max_train_epochs: expected an integer, got {epochs!r}") from None

    def bind(self, run_dir: Path, ledger: Ledger, journal: Journal, say: Say) -> None:
        super().bind(run_dir, ledger, journal, say)
        # Its media and captions reach it only through its caches: an edit is said, never applied.
        self.kohya_inputs = self.inputs = self.musubi_inputs = MusubiInputs(self.plan, self.cwd, run_dir,
                                                                            self.settings, journal, say)

    def identity(self) -> dict[str, Any]:
        given = prepare(list(self.given), self.cwd, self.settings, as_given=True, dialect=MUSUBI)
        script = os.path.basename(given.plan.command.launcher[-1])
        return identity_fields(script, given.plan, self.cwd, self.output_dir, media_dirs(given.plan, self.cwd),
                               SHAPING)

    def samples(self) -> Samples | None:
        name = self.prepared.output_name
        return Samples(((self.output_dir or self.cwd) / "sample",), f"^{re.escape(f'{name}_' if name else '')}"
                       + _SAMPLE_STEP)

    def processes(self) -> int:
        """``accelerate launch --num_processes N``: every process writes its ``random_states_N.pkl``."""
        launcher = self.plan.command.launcher
        for i, token in enumerate(launcher):
            value = launcher[i + 1] if token == "--num_processes" and i + 1 < len(launcher) else \
                token.partition("=")[2] if token.startswith("--num_processes=") else None
            if value is not None and value.isdigit() and int(value) > 0:
                return int(value)
        return 1

    def run_steps(self) -> int | None:
        """The steps the whole run trains: ``--max_train_steps``, or for ``--max_train_epochs`` the
        epochs times the steps per epoch its summary gave (as musubi computes it)."""
        if self.epochs is None:
            return self.total_steps
        per_epoch = self.points.per_epoch()
        return self.epochs * per_epoch if per_epoch else None

    def resume_flags(self, plan: LaunchPlan, resume: StateRecord | None) -> bool:
        cmd = plan.command
        if resume is None:
            cmd.remove("resume")
            return False
        cmd.set("resume", resume.dir)
        total = self.run_steps()
        if total is not None:
            # It counts from 0 again and trains --max_train_steps more: the steps left, by steps.
            cmd.set("max_train_steps", str(max(1, total - resume.step)))
            cmd.remove("max_train_epochs")
            if plan.config_value("max_train_epochs") is not None:
                plan.config_overlay_removed.add("max_train_epochs")
        return False  # its labels are known: the resume step behind the true steps

    def on_summary(self, summary: Mapping[str, Any]) -> Notice | None:
        total = summary.get(TOTAL_STEPS)
        if self.epochs is not None and isinstance(total, int) and total > 0 and self.points.resume_step == 0:
            # --max_train_epochs: the run's steps are known now (a resumed attempt says only its own)
            self.total_steps = total
            self.points.cadence = dataclasses.replace(self.points.cadence, max_steps=total)
            if self.points.samples is not None:
                shelf = self.points.samples
                shelf.cadence = dataclasses.replace(shelf.cadence, max_steps=total)
        return super().on_summary(summary)

    def launch(self, plan: Plan, attempt: int, resume: StateRecord | None, run_dir: Path) -> Launch:
        assert isinstance(plan, LaunchPlan)
        launched = super().launch(plan, attempt, resume, run_dir)
        derived = plan.command.get("dataset_config")
        cached_from = self.musubi_inputs.cached_from
        if derived is None or plan.dataset_doc is None or cached_from is None or plan.user_dataset is None:
            return launched
        doc = recache.scaled(tomlio.read_toml(Path(derived)), plan.dataset_scale)
        found = recache.plan(cached_from, doc, plan.command, self.cwd, run_dir, Path(derived))
        if found is None:
            return launched
        recache.write(found, Path(derived), plan.user_dataset)
        return dataclasses.replace(launched, before=(found.step,) if found.step is not None else ())

    def apply(self, plan: Plan, action: Action, evidence: Said = NOTHING_SAID) -> str | None:
        assert isinstance(plan, LaunchPlan)
        if action.kind != "lower_resolution":
            return super().apply(plan, action, evidence)
        # Its latents are made from the images at the dataset's resolution: a lower one needs them made
        # again, with the VAE the command names (musubi's training command needs it only to sample).
        if plan.dataset_doc is None or plan.user_dataset is None or not caches.latent_models_known(plan.command):
            return None
        scale = plan.dataset_scale * float(action.value or "0.75")
        before, after = recache.scaled(plan.dataset_doc, plan.dataset_scale), recache.scaled(plan.dataset_doc, scale)
        side = recache.smallest_side(after)
        if side is None or side < recache.MIN_SIDE or recache.resolutions(before) == recache.resolutions(after):
            return None
        plan.dataset_scale = scale
        shown = ", ".join(str(r) for r in recache.resolutions(after))
        return (f"resolution {shown} in a derived copy of {plan.user_dataset} (latents cached again into the run dir "
                "before the launch)")

    def ladder(self, fault: str, plan: Plan | None = None) -> tuple[Rung, ...]:
        return musubi_ladder(fault)

    def rules(self) -> tuple[FaultRule, ...]:
        return RUN_RULES

    def doctor(self, env: Mapping[str, str]) -> list[Finding]:
        return musubi_doctor.findings(self.doctor_view, self.doctor_facts)


class MusubiFamily:
    name = "musubi"
    description = "kohya-ss musubi-tuner (wan_train_network.py, hv_train_network.py, qwen_image_train.py, ...)"

    def output(self) -> OutputFormat:
        return MusubiOutput()

    def rules(self) -> tuple[FaultRule, ...]:
        return FAMILY_RULES

    def ladder(self, fault: str) -> tuple[Rung, ...]:
        """The ladder needs no command: ``diagnose`` proposes it for a log read as musubi's."""
        return musubi_ladder(fault)

    def detect(self, argv: Sequence[str]) -> int:
        """Its scripts by name (``src/musubi_tuner/X.py``, ``X.py``, ``-m musubi_tuner.X``); nothing else:
        its flags are sd-scripts' too, and a renamed copy is claimed by them as sd-scripts'."""
        try:
            token = argv[find_script(list(argv))]
        except ValueError:
            return NO_CLAIM
        script = os.path.basename(token)[:-3] if token.endswith(".py") else token.rsplit(".", 1)[-1]
        return NAMES_SCRIPT if is_training_script(script) else NO_CLAIM

    def open(self, setup: Setup) -> TrainerRun:
        return MusubiRun(setup)


FAMILY = MusubiFamily()
