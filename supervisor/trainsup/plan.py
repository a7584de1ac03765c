"""Owns the launch plan: the trainer command and environment for the next attempt, and edits to it.

Applies remedy actions knowing which flags take values and which exist in which script. A flag
inside ``--config_file`` is removed by writing a derived TOML into the run directory (the user's
file is never touched) and pointing ``--config_file`` at it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import tomlio
from .cmdline import TrainerCommand
from .fsutil import atomic_write_text
from .profile import ScriptInfo, script_info, takes_value
from .remedies import Action, Rung


@dataclass
class LaunchPlan:
    command: TrainerCommand
    env: dict[str, str] = field(default_factory=dict)  # overrides on top of the inherited environment
    config_overlay_removed: set[str] = field(default_factory=set)  # keys dropped from --config_file
    user_config: Path | None = None  # the user's own --config_file, never modified
    config_doc: dict[str, Any] | None = None  # its accepted content: what every launch gets a copy of

    @property
    def info(self) -> ScriptInfo:
        return script_info(self.command.script)

    def copy(self) -> LaunchPlan:
        return LaunchPlan(self.command.copy(), dict(self.env), set(self.config_overlay_removed),
                          self.user_config, self.config_doc)

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

    def write_derived_config(self, run_dir: Path, attempt: int) -> None:
        """Give the launch its own frozen copy of the accepted --config_file, minus removed keys.

        The user may edit their file while the run trains; the trainer only ever reads this copy,
        so an edit reaches it when trainsup has accepted it (see ``live``).
        """
        if self.user_config is None or self.config_doc is None:
            return
        derived, _ = tomlio.without_keys(self.config_doc, self.config_overlay_removed)
        path = run_dir / "derived" / f"attempt-{attempt}.config.toml"
        atomic_write_text(path, f"# derived by trainsup from {self.user_config}\n" + tomlio.dumps(derived))
        self.command.set("config_file", str(path))


def apply_action(plan: LaunchPlan, action: Action) -> str | None:
    """Apply one action; return what changed in words, or None when it does not apply here."""
    cmd = plan.command
    if action.kind == "add_flag":
        if not plan.info.has_flag(action.name) or plan.effective(action.name):
            return None
        value = action.value
        if takes_value(action.name):
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
        if plan.config_value(action.name) not in (None, False):
            plan.config_overlay_removed.add(action.name)
            return f"remove --{action.name} (set in {plan.user_config}; a derived copy drops it)"
        return action.describe() if changed else None
    if action.kind == "set_env":
        if plan.env.get(action.name) == action.value:
            return None
        plan.env[action.name] = action.value or ""
        return action.describe()
    if action.kind == "halve_batch":
        batch = cmd.get_int("train_batch_size") or 1
        if batch <= 1:
            return None
        accum = cmd.get_int("gradient_accumulation_steps") or 1
        cmd.set("train_batch_size", str(batch // 2))
        cmd.set("gradient_accumulation_steps", str(accum * 2))
        return f"--train_batch_size {batch // 2} --gradient_accumulation_steps {accum * 2}"
    if action.kind == "lower_workers":
        current = cmd.get_int("max_data_loader_n_workers")
        current = 8 if current is None else current  # kohya's default
        target = current // 2 if action.value == "half" else int(action.value or 0)
        if target >= current:
            return None
        cmd.set("max_data_loader_n_workers", str(target))
        return f"--max_data_loader_n_workers {target}"
    if action.kind in ("restart", "upgrade", "stop"):
        return action.describe()  # carried out by the engine, not by an edit of the command
    raise ValueError(f"unknown action kind {action.kind!r}")


def rung_applies(plan: LaunchPlan, rung: Rung) -> bool:
    """Whether a remedy rung would do anything for this command (a dry run on a copy of the plan)."""
    trial = plan.copy()
    for action in rung.actions:
        if action.kind in ("restart", "upgrade", "stop"):
            return True
        try:
            if apply_action(trial, action) is not None:
                return True
        except (ValueError, OSError):
            continue
    return False


def upgrade_spec(action: Action, evidence: str | None) -> str:
    """The package spec an upgrade action installs, given the fault's evidence line."""
    if evidence and "unexpected keyword argument 'device'" in evidence:
        return "safetensors>=0.4.3"  # the resume-side failure (load_model) needs the later release
    return action.name
