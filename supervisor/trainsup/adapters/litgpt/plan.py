"""Owns the LitGPT launch plan: the command (launcher, subcommand, positional, ``--flag value`` and
dotted ``--group.key value`` flags), the ``--config`` files it names, and reading or changing a
setting the way jsonargparse resolves it.

jsonargparse applies arguments left to right and a ``--config FILE`` applies all of its keys at its
place in the line (seen on the bed: ``--train.max_steps 7 --config c.yaml`` gives the file's value,
``--config c.yaml --train.max_steps 7`` gives 7). ``value`` follows that order. ``set`` makes the new
value win wherever the old one came from: the flag is changed in place (or appended), and a
``--config`` that sets the key gets a derived copy in the run dir with the new value, so its place
in the line no longer matters. The user's files are never written.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ...trainers.base import Plan
from ...trainers.cmdline import Flag, TrainerCommand
from .configfile import ConfigFile
from .methods import TRAINING_SUBCOMMANDS, Method, is_schedule_key


def find_subcommand(argv: list[str]) -> int | None:
    """Index of the training subcommand: after the ``litgpt`` console script (any path to it) or
    after ``-m litgpt``; None when the command is not a LitGPT training run."""
    for i, token in enumerate(argv[:-1]):
        base = os.path.basename(token).removesuffix(".exe")
        if base == "litgpt" and not token.startswith("-") and (i == 0 or argv[i - 1] != "-m"):
            return i + 1 if argv[i + 1] in TRAINING_SUBCOMMANDS else None
        if token == "-m" and argv[i + 1] in ("litgpt", "litgpt.__main__"):
            return i + 2 if i + 2 < len(argv) and argv[i + 2] in TRAINING_SUBCOMMANDS else None
    return None


@dataclass
class LitPlan(Plan):
    command: TrainerCommand  # launcher = [..., litgpt, SUBCOMMAND, positional?]
    sub_at: int  # index of the subcommand in the launcher
    method: Method
    cwd: Path
    configs: dict[str, ConfigFile] = field(default_factory=dict)  # --config value as given -> file
    env: dict[str, str] = field(default_factory=dict)
    # Bumped by every change of an LR-schedule setting: a state saved under another generation
    # carries the old schedule, and LitGPT restores the schedule from the state.
    schedule_gen: int = 0

    @classmethod
    def parse(cls, argv: list[str], sub_at: int, method: Method, cwd: Path) -> LitPlan:
        command = TrainerCommand.parse(list(argv), script_at=sub_at)
        return cls(command, sub_at, method, cwd)

    def copy(self) -> LitPlan:
        return LitPlan(self.command.copy(), self.sub_at, self.method, self.cwd,
                       {k: c.copy() for k, c in self.configs.items()}, dict(self.env), self.schedule_gen)

    # --- reading -----------------------------------------------------------------------------
    @property
    def subcommand(self) -> str:
        return self.command.launcher[self.sub_at]

    @property
    def launcher_head(self) -> list[str]:
        """The part before the subcommand (``litgpt`` or ``python -m litgpt``)."""
        return self.command.launcher[: self.sub_at]

    def positional(self) -> str | None:
        """The first positional (the checkpoint dir; pretrain's model name), or the config's key."""
        extra = self.command.launcher[self.sub_at + 1:]
        if extra:
            return extra[0]
        for flag in self.command.flags:
            if len(flag.values) > 1:  # every LitGPT flag takes one value: the rest is positional
                return flag.values[1]
        return self.value(self.method.positional)

    def config_paths(self) -> list[str]:
        return [f.values[0] for f in self.command.flags if f.name == "config" and f.values]

    def resolve(self, given: str) -> Path:
        path = Path(given).expanduser()
        return path if path.is_absolute() else self.cwd / path

    def flag_value(self, key: str) -> str | None:
        for flag in reversed(self.command.flags):
            if flag.name == key and flag.values:
                return flag.values[0]
        return None

    def value(self, key: str) -> str | None:
        """The setting as jsonargparse resolves it: flags and ``--config`` files in order."""
        found: str | None = None
        for flag in self.command.flags:
            if not flag.values:
                continue
            if flag.name == "config":
                cfg = self.configs.get(flag.values[0])
                if cfg is not None and cfg.has(key):
                    found = cfg.get(key)
            elif flag.name == key:
                found = flag.values[0]
        return found

    def get_int(self, key: str, default: int | None = None) -> int | None:
        text = self.value(key)
        if text is None or text.lower() in ("null", "none"):
            return default
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"--{key}: expected an integer, got {text!r}") from None

    def where(self, key: str) -> str:
        """Where the setting comes from, for messages: the flag, a config file, or the default."""
        sources = [f"--{key}"] if self.flag_value(key) is not None else []
        sources += [str(c.path) for c in self.configs.values() if c.has(key)]
        return " and ".join(sources) or "the default"

    # --- editing -----------------------------------------------------------------------------
    def set(self, key: str, value: str) -> None:
        if is_schedule_key(key) and self.value(key) != value:
            self.schedule_gen += 1
        for cfg in self.configs.values():
            if cfg.has(key):
                cfg.set(key, value)
        if self.flag_value(key) is not None or not any(c.has(key) for c in self.configs.values()):
            self._set_flag(key, value)

    def unset(self, key: str) -> bool:
        """Remove the setting from the command line and (in derived copies) from config files."""
        changed = self.command.remove(key)
        for cfg in self.configs.values():
            if cfg.has(key):
                cfg.delete(key)
                changed = True
        return changed

    def _set_flag(self, key: str, value: str) -> None:
        for flag in self.command.flags:
            if flag.name == key:
                # keep a positional that followed the old value where it was
                flag.values = [value, *flag.values[1:]]
                self.command.flags = [f for f in self.command.flags if f.name != key or f is flag]
                return
        self.command.flags.append(Flag(key, [value]))

    def write_derived_configs(self, run_dir: Path, attempt: int) -> list[Path]:
        """Point every ``--config`` a remedy changed at a derived copy in the run dir."""
        written: list[Path] = []
        for n, flag in enumerate(f for f in self.command.flags if f.name == "config" and f.values):
            cfg = self.configs.get(flag.values[0])
            if cfg is None or not cfg.changed:
                continue
            target = run_dir / "derived" / f"attempt-{attempt}.config-{n + 1}.yaml"
            cfg.write_derived(target)
            self.configs[str(target)] = ConfigFile(target, cfg.applied())
            flag.values = [str(target), *flag.values[1:]]
            written.append(target)
        return written

    def argv(self) -> list[str]:
        return self.command.argv()
