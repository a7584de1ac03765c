"""Owns the launch plan: the trainer command and environment for the next attempt, and edits to it.

Applies remedy actions knowing which flags take values and which exist in which script. A flag
inside ``--config_file`` (or a key of ``--dataset_config``) is removed by writing a derived TOML into
the run directory (the user's file is never touched) and pointing the trainer at it. A dataset's
``batch_size`` overrides ``--train_batch_size``, so halving the batch halves it there too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from ...faults import remedies
from ...faults.remedies import TIMEOUT_FACTOR, Action
from ...faults.verdict import NOTHING_SAID, Said
from ...record.fsutil import atomic_write_text
from ...trainers.base import Plan, apply_env, restart_with_same_settings
from ...trainers.cmdline import TrainerCommand
from . import tomlio
from .dialect import KOHYA, Dialect
from .profile import ScriptInfo
from .tomlio import TomlDoc


@dataclass
class LaunchPlan(Plan):
    command: TrainerCommand
    env: dict[str, str] = field(default_factory=dict)  # overrides on top of the inherited environment
    config_overlay_removed: set[str] = field(default_factory=set)  # keys dropped from --config_file
    user_config: Path | None = None  # the user's own --config_file, never modified
    config_doc: TomlDoc | None = None  # its accepted content: what every launch gets a copy of
    user_dataset: Path | None = None  # the user's own --dataset_config, never modified
    dataset_doc: TomlDoc | None = None  # its accepted content
    dataset_removed: set[str] = field(default_factory=set)  # keys dropped from --dataset_config
    dataset_batch_divisor: int = 1  # every dataset's batch_size is divided by this (at least 1)
    # every dataset's resolution is multiplied by this (musubi's remedy: its adapter writes it, with the
    # latents cached again in the run dir; sd-scripts' ladders never set it)
    dataset_scale: float = 1.0
    dialect: Dialect = KOHYA  # which scripts and flags exist (sd-scripts', or musubi-tuner's)

    @property
    def info(self) -> ScriptInfo:
        return self.dialect.info(self.command.script)

    def copy(self) -> LaunchPlan:
        return LaunchPlan(self.command.copy(), dict(self.env), set(self.config_overlay_removed),
                          self.user_config, self.config_doc, self.user_dataset, self.dataset_doc,
                          set(self.dataset_removed), self.dataset_batch_divisor, self.dataset_scale,
                          self.dialect)

    def config_value(self, name: str) -> object | None:
        """The value kohya would see for a key of the --config_file (after our removals)."""
        if self.config_doc is None or name in self.config_overlay_removed:
            return None
        return tomlio.flat_keys(self.config_doc).get(name)

    def effective(self, name: str) -> bool:
        """Whether the trainer will see this flag on: command line, or true in the config file."""
        return self.command.has(name) or self.config_value(name) not in (None, False)

    def value(self, name: str) -> object | None:
        """The flag's value as kohya resolves it: the command line over the config file."""
        v = self.command.get(name)
        return v if v is not None else self.config_value(name)

    def dataset_batch_sizes(self) -> list[int]:
        """The ``batch_size`` values the dataset config sets (they override --train_batch_size)."""
        if self.dataset_doc is None:
            return []
        return [v for v in tomlio.values_of(self.dataset_doc, "batch_size") if isinstance(v, int)]

    def write_derived_configs(self, run_dir: Path, attempt: int) -> None:
        """Give the launch its own frozen copies of the accepted --config_file and --dataset_config,
        minus removed keys.

        The user may edit their files while the run trains; the trainer only ever reads these
        copies, so an edit reaches it when trainsup has accepted it (see ``live``).
        """
        if self.user_config is not None and self.config_doc is not None:
            path = run_dir / "derived" / f"attempt-{attempt}.config.toml"
            atomic_write_text(path, _header(self.user_config)
                              + tomlio.derive(self.config_doc, self.config_overlay_removed))
            self.command.set("config_file", str(path))
        if self.user_dataset is not None and self.dataset_doc is not None:
            divisor = self.dataset_batch_divisor
            edits = {"batch_size": lambda v: max(1, int(v) // divisor)} if divisor > 1 else None
            path = run_dir / "derived" / f"attempt-{attempt}.dataset.toml"
            atomic_write_text(path, _header(self.user_dataset)
                              + tomlio.derive(self.dataset_doc, self.dataset_removed, edits))
            self.command.set("dataset_config", str(path))


def _header(source: Path) -> str:
    return f"# derived by trainsup from {source}\n"


def apply_action(plan: LaunchPlan, action: Action, evidence: Said = NOTHING_SAID) -> str | None:
    """Apply one action; return what changed in words, or None when it does not apply here."""
    cmd = plan.command
    if action.kind == "raise_timeout":
        return raise_ddp_timeout(plan, float(action.value or TIMEOUT_FACTOR), evidence)
    if action.kind == "add_flag":
        if not plan.info.has_flag(action.name) or plan.effective(action.name):
            return None
        value = action.value
        if plan.dialect.takes_value(action.name):
            cmd.set(action.name, value or "")
        else:
            cmd.set(action.name)
        extra = ""
        if action.name in ("fp8_base", "fp8_base_unet") and cmd.get("mixed_precision") in (None, "no") \
                and plan.config_value("mixed_precision") in (None, "no"):
            cmd.set("mixed_precision", "bf16")  # kohya refuses fp8_base without fp16/bf16
            extra = " and --mixed_precision bf16 (fp8 needs it)"
        return action.describe() + extra
    if action.kind == "remove_flag":
        changed = cmd.remove(action.name)
        where = []
        if plan.config_value(action.name) not in (None, False):
            plan.config_overlay_removed.add(action.name)
            where.append(str(plan.user_config))
        if (plan.dataset_doc is not None and action.name not in plan.dataset_removed
                and action.name in tomlio.keys_anywhere(plan.dataset_doc)):
            plan.dataset_removed.add(action.name)
            where.append(str(plan.user_dataset))
        if where:
            return f"remove --{action.name} (set in {' and '.join(where)}; a derived copy drops it)"
        return action.describe() if changed else None
    if action.kind == "set_env":
        return apply_env(plan, action)
    if action.kind == "halve_batch":
        batch = cmd.get_int("train_batch_size") or 1
        # A dataset's own batch_size wins over the flag: halve it there (in the derived copy).
        dataset_batches = [max(1, b // plan.dataset_batch_divisor) for b in plan.dataset_batch_sizes()]
        if batch <= 1 and not any(b > 1 for b in dataset_batches):
            return None
        accum = cmd.get_int("gradient_accumulation_steps") or 1
        done = []
        if batch > 1:
            cmd.set("train_batch_size", str(batch // 2))
            done.append(f"--train_batch_size {batch // 2}")
        if any(b > 1 for b in dataset_batches):
            plan.dataset_batch_divisor *= 2
            done.append(f"batch_size halved in a derived copy of {plan.user_dataset}")
        cmd.set("gradient_accumulation_steps", str(accum * 2))
        return ", ".join(done) + f", --gradient_accumulation_steps {accum * 2}"
    if action.kind == "lower_workers":
        current = cmd.get_int("max_data_loader_n_workers")
        current = 8 if current is None else current  # kohya's default
        target = current // 2 if action.value == "half" else int(action.value or 0)
        if target >= current:
            return None
        cmd.set("max_data_loader_n_workers", str(target))
        return f"--max_data_loader_n_workers {target}"
    # carried out by the engine, not by an edit of the command; or an action of another trainer's ladder
    return restart_with_same_settings(action)  # an action of another trainer's ladder: it means nothing to kohya


DEFAULT_DDP_TIMEOUT_MIN = 30  # accelerate's and torch's default process group timeout, in --ddp_timeout's minutes


def raise_ddp_timeout(plan: LaunchPlan, factor: float, evidence: Said) -> str | None:
    """``--ddp_timeout`` (minutes) raised ``factor`` times, where the script has it (see
    ``remedies.raised_timeout_s``). sd-scripts hands it to accelerate only with several CUDA devices."""
    if not plan.info.has_flag("ddp_timeout"):
        return None
    current = plan.command.get_int("ddp_timeout")
    if current is None:
        configured = plan.config_value("ddp_timeout")
        current = configured if isinstance(configured, int) and not isinstance(configured, bool) else None
    raised_s = remedies.raised_timeout_s(current * 60 if current else None, DEFAULT_DDP_TIMEOUT_MIN * 60, evidence,
                                         factor)
    minutes = max(1, math.ceil(raised_s / 60))
    plan.command.set("ddp_timeout", str(minutes))
    was = f"was {current}" if current else f"default {DEFAULT_DDP_TIMEOUT_MIN}"
    return f"--ddp_timeout {minutes} ({was}): a rank was busy longer than the collective timeout"


def upgrade_spec(action: Action, evidence: Said) -> str:
    """The package spec an upgrade action installs, given the fault's evidence (line and named groups)."""
    if evidence.line and "unexpected keyword argument 'device'" in evidence.line:
        return "safetensors>=0.4.3"  # the resume-side failure (load_model) needs the later release
    return remedies.upgrade_spec(action, evidence)  # what an import-time requirement asks, if it did
