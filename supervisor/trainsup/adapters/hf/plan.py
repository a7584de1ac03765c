"""Owns the Trainer family's launch plan: which front-end the command is, where its settings are, and
reading or changing one the way that front-end resolves it.

Three shapes, told apart by ``front_end``:

- ``trl SUB ...`` / ``python -m trl SUB ...`` and a script of one's own (``accelerate launch``,
  ``torchrun`` or ``python`` of ``train.py``): ``TrainingArguments`` as ``--flag value`` (TRL also takes
  the dashed spelling), TRL's ``--config FILE.yaml`` underneath them (its values become argparse
  defaults, so a flag wins);
- ``axolotl train CFG.yml`` / ``python -m axolotl.cli.train CFG.yml`` and ``llamafactory-cli train
  CFG.yaml``: the YAML holds everything (LLaMA-Factory also takes ``key=value`` after it, axolotl
  ``--key=value``). Their output dir, steps and batch are read from it.

``set``/``unset`` change a flag in place for the first shape; for the YAML front-ends (and TRL's config
when it holds the key) they mark the key in ``yaml_edits``, and ``argv`` then names a derived copy of the
YAML in the run dir instead of the user's file, which is never written.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from ...record.fsutil import atomic_write_text
from ...trainers.base import Plan
from ...trainers.cmdline import TrainerCommand, find_script

FrontEnd = Literal["trl", "script", "axolotl", "llamafactory"]
# TRL's CLI commands that train (``trl env``, ``trl vllm-serve`` do not)
TRL_COMMANDS = frozenset({"sft", "dpo", "grpo", "kto", "orpo", "reward", "ppo", "rloo", "cpo", "bco", "xpo",
                          "nash_md", "online_dpo", "gkd", "prm"})
_YAML = (".yaml", ".yml")
# axolotl's names of the Trainer settings it renames
_AXOLOTL_NAMES = {"per_device_train_batch_size": "micro_batch_size"}
_UNSET = object()


def _base(token: str) -> str:
    return os.path.basename(token).removesuffix(".exe")


def find_front_end(argv: list[str]) -> tuple[FrontEnd, int] | None:
    """The front-end the command runs and the index of the token its flags follow (TRL's subcommand,
    a YAML front-end's config file, a script); None when it is none of them by name."""
    for i, token in enumerate(argv):
        base = _base(token)
        prev = argv[i - 1] if i else ""
        nxt = argv[i + 1] if i + 1 < len(argv) else ""
        if base == "trl" and prev != "-m" and nxt in TRL_COMMANDS:
            return "trl", i + 1
        if token == "-m" and nxt == "trl" and i + 2 < len(argv) and argv[i + 2] in TRL_COMMANDS:
            return "trl", i + 2
        if base == "axolotl" and prev != "-m" and nxt == "train":
            return "axolotl", _config_at(argv, i + 2)
        if token == "-m" and nxt in ("axolotl.cli.train", "axolotl.cli.main"):
            return "axolotl", _config_at(argv, i + 2)
        if base in ("llamafactory-cli", "lmf") and nxt == "train":
            return "llamafactory", _config_at(argv, i + 2)
    return None


def _config_at(argv: list[str], start: int) -> int:
    """The YAML's index after a YAML front-end's subcommand (the subcommand's when there is none)."""
    for i in range(start, len(argv)):
        if argv[i].endswith(_YAML) and not argv[i].startswith("-"):
            return i
    return start - 1


def script_at(argv: list[str]) -> int | None:
    """The script of ``accelerate launch``/``torchrun``/``python`` (a ``*.py`` or ``-m`` module)."""
    try:
        return find_script(list(argv))
    except ValueError:
        return None


@dataclass
class HfPlan(Plan):
    front_end: FrontEnd
    command: TrainerCommand  # launcher ends at the subcommand, config file or script
    cwd: Path
    config_at: int | None = None  # the launcher index of the YAML config (a YAML front-end's), if any
    config_flag: str | None = None  # TRL: the flag whose value is the config (``config``)
    config: dict[str, Any] = field(default_factory=dict)  # the user's YAML as read
    yaml_edits: dict[str, Any] = field(default_factory=dict)  # key -> value (None: removed)
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, argv: list[str], front_end: FrontEnd, at: int, cwd: Path) -> HfPlan:
        command = TrainerCommand.parse(list(argv), script_at=at)
        plan = cls(front_end, command, cwd)
        if front_end in ("axolotl", "llamafactory") and argv[at].endswith(_YAML):
            plan.config_at = at
        elif front_end == "trl" and command.get("config"):
            plan.config_flag = "config"
        return plan

    def copy(self) -> HfPlan:
        return HfPlan(self.front_end, self.command.copy(), self.cwd, self.config_at, self.config_flag,
                      self.config, dict(self.yaml_edits), dict(self.env))

    # --- the config file ---------------------------------------------------------------------------
    def config_path(self) -> Path | None:
        """The user's YAML, resolved against the command's cwd."""
        given = self.command.launcher[self.config_at] if self.config_at is not None else \
            self.command.get(self.config_flag) if self.config_flag else None
        if not given:
            return None
        path = Path(given).expanduser()
        return path if path.is_absolute() else self.cwd / path

    def load_config(self) -> None:
        """Read the YAML (raises OSError or ValueError with the reason)."""
        path = self.config_path()
        if path is None:
            return
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ValueError(f"expected a mapping of settings, got {type(data).__name__}")  # noqa: TRY004 - a bad file, not a bad call
        self.config = data

    # --- reading -----------------------------------------------------------------------------------
    def key(self, name: str) -> str:
        """The front-end's name of a ``TrainingArguments`` setting."""
        return _AXOLOTL_NAMES.get(name, name) if self.front_end == "axolotl" else name

    def _flag_name(self, name: str) -> str | None:
        """The spelling of ``name`` the command uses as a flag (underscores or dashes), if it has it."""
        key = self.key(name)
        for spelling in (key, key.replace("_", "-")):
            if self.command.has(spelling):
                return spelling
        return None

    def _override(self, name: str) -> str | None:
        """A ``key=value`` after LLaMA-Factory's YAML (its last one)."""
        found = None
        for token in self.command.launcher[(self.config_at or len(self.command.launcher)) + 1:]:
            k, eq, v = token.partition("=")
            if eq and k == name:
                found = v
        return found

    def value(self, name: str) -> Any:
        """The setting as the trainer will see it: a flag, else a ``key=value``, else the YAML
        (a derived copy's edit first), else None."""
        flag = self._flag_name(name)
        if flag is not None:
            return self.command.get(flag)
        override = self._override(name)
        if override is not None:
            return override
        key = self.key(name)
        if key in self.yaml_edits:
            return self.yaml_edits[key]
        return self.config.get(key)

    def get_int(self, name: str) -> int | None:
        value = self.value(name)
        if value is None or isinstance(value, bool):
            return None
        try:
            return int(str(value))
        except ValueError:
            raise ValueError(f"{self.key(name)}: expected an integer, got {value!r}") from None

    @property
    def yaml_driven(self) -> bool:
        return self.config_at is not None

    # --- editing -----------------------------------------------------------------------------------
    def set(self, name: str, value: Any) -> None:
        """Make ``value`` the setting the trainer sees (a flag in place, or the YAML copy's key)."""
        flag = self._flag_name(name)
        key = self.key(name)
        if flag is not None or not self.yaml_driven:
            self.command.set(flag or key, _text(value))
            if self.config_flag and key in self.config:
                self.yaml_edits.pop(key, None)  # the flag wins over TRL's config anyway
        else:
            self.yaml_edits[key] = value
        self._drop_override(key)

    def unset(self, name: str) -> None:
        """No value of the trainer's for it: the flag removed, and the YAML copy without the key."""
        flag = self._flag_name(name)
        if flag is not None:
            self.command.remove(flag)
        key = self.key(name)
        if key in self.config:
            self.yaml_edits[key] = None
        self._drop_override(key)

    def _drop_override(self, key: str) -> None:
        if self.config_at is None:
            return
        head = self.command.launcher[: self.config_at + 1]
        rest = [t for t in self.command.launcher[self.config_at + 1:] if t.partition("=")[0] != key]
        self.command.launcher = head + rest

    # --- the launch --------------------------------------------------------------------------------
    def argv(self, run_dir: Path | None = None, attempt: int = 0) -> list[str]:
        """The command; with ``run_dir``, a YAML with edits is replaced by its derived copy there."""
        command = self.command.copy()
        if run_dir is not None and self.yaml_edits and self.config_path() is not None:
            derived = self.write_derived(run_dir, attempt)
            if self.config_at is not None:
                command.launcher[self.config_at] = str(derived)
            elif self.config_flag:
                command.set(self.config_flag, str(derived))
        return command.argv()

    def derived(self) -> dict[str, Any]:
        data = dict(self.config)
        for key, value in self.yaml_edits.items():
            if value is None:
                data.pop(key, None)
            else:
                data[key] = value
        return data

    def write_derived(self, run_dir: Path, attempt: int) -> Path:
        """The YAML with this plan's edits, as ``RUN_DIR/attempt-N-NAME`` (the user's file untouched)."""
        source = self.config_path()
        assert source is not None
        path = run_dir / f"attempt-{attempt}-{source.name}"
        atomic_write_text(path, yaml.safe_dump(self.derived(), sort_keys=False))
        return path


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def is_true(value: Any) -> bool:
    return value is True or (isinstance(value, str) and value.strip().lower() in ("true", "1", "yes", "latest"))


def is_off(value: Any) -> bool:
    return value is None or value is False or (isinstance(value, str) and value.strip().lower() in
                                               ("", "false", "0", "no", "none", "null"))
