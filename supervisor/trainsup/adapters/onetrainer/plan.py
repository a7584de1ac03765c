"""Owns the OneTrainer launch plan: the command (``python scripts/train.py --config-path CONFIG.json``
with optional ``--config-value KEY=VALUE`` overrides), the config it names, reading a setting the
way ``scripts/train.py`` resolves it, and writing the derived copy of the config an attempt runs with.

``scripts/train.py`` loads ``--config-path``, then applies each ``--config-value`` in order (dotted
keys reach nested objects). A remedy's value must win wherever the old one came from: it goes into
the derived copy (``RUN_DIR/attempt-N/config.json``), ``--config-path`` points at that copy, and a
``--config-value`` of the same key is dropped from the command line. The user's config is only
read; an edit of it reaches a later attempt through ``accept`` (inputs) and a fresh derived copy.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...record.textfile import read_text
from ...trainers.base import Plan

SCRIPT = "train.py"
_PATH_FLAG, _VALUE_FLAG = "--config-path", "--config-value"
_MISSING = object()


def find_script(argv: list[str]) -> int | None:
    """Index of ``scripts/train.py`` (any path ending so) in a python command, or None."""
    for i, token in enumerate(argv[:4]):
        norm = token.replace("\\", "/")
        if norm == f"scripts/{SCRIPT}" or norm.endswith(f"/scripts/{SCRIPT}"):
            head = os.path.basename(argv[0]).removesuffix(".exe")
            if i > 0 and head.startswith("python"):
                return i
    return None


def split_value(text: str) -> tuple[str, str]:
    key, _, value = text.partition("=")
    return key.strip(), value


def get_dotted(doc: dict[str, Any], key: str, default: Any = _MISSING) -> Any:
    node: Any = doc
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None if default is _MISSING else default
        node = node[part]
    return node


def set_dotted(doc: dict[str, Any], key: str, value: Any) -> None:
    *parents, leaf = key.split(".")
    node = doc
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[leaf] = value


def load_config(path: Path) -> dict[str, Any]:
    """The config as a JSON object; ValueError naming the file and what is wrong."""
    text = read_text(path, "config file", boms=False)  # NotTextError is a ValueError naming the file
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(doc).__name__}")  # noqa: TRY004 - a usage error
    return doc


@dataclass
class OTPlan(Plan):
    argv: list[str]  # the user's command as given
    script_at: int
    cwd: Path
    config_path: Path  # the user's config (resolved)
    doc: dict[str, Any]  # the user's config as last accepted
    overrides: dict[str, Any] = field(default_factory=dict)  # key -> value, set by remedies
    env: dict[str, str] = field(default_factory=dict)
    # After a NaN: resume only from a backup below this step (the newest one may hold blown-up weights)
    resume_below: int | None = None
    tainted_by: int = 0  # the attempt whose NaN ``resume_below`` answers: later attempts' backups are sound

    @classmethod
    def parse(cls, argv: list[str], cwd: Path, read: bool = True) -> OTPlan:
        at = find_script(argv)
        if at is None:
            raise ValueError("not a OneTrainer command: expected `python scripts/train.py --config-path CONFIG.json`")
        given = _flag_values(argv[at + 1:], _PATH_FLAG)
        if not given:
            raise ValueError("scripts/train.py: --config-path CONFIG.json is required")
        path = Path(given[-1]).expanduser()
        path = path if path.is_absolute() else cwd / path
        doc = load_config(path) if read else {}
        return cls(list(argv), at, cwd, Path(os.path.normpath(path)), doc)

    def copy(self) -> OTPlan:
        return OTPlan(list(self.argv), self.script_at, self.cwd, self.config_path, self.doc,
                      copy.deepcopy(self.overrides), dict(self.env), self.resume_below, self.tainted_by)

    # --- reading -----------------------------------------------------------------------------
    def cli_values(self) -> list[tuple[str, str]]:
        return [split_value(v) for v in _flag_values(self.argv[self.script_at + 1:], _VALUE_FLAG)]

    def value(self, key: str, default: Any = None) -> Any:
        """The setting as ``scripts/train.py`` resolves it: remedies, then the last ``--config-value``
        of the key (a string, a bool for the bool keys), then the config file."""
        if key in self.overrides:
            return self.overrides[key]
        found: Any = _MISSING
        for k, v in self.cli_values():
            if k == key:
                found = v
        if found is not _MISSING:
            return found
        return get_dotted(self.doc, key, default)

    def where(self, key: str) -> str:
        if key in self.overrides:
            return "a remedy"
        if any(k == key for k, _ in self.cli_values()):
            return f"--config-value {key}=..."
        return str(self.config_path) if get_dotted(self.doc, key, _MISSING) is not _MISSING else "the default"

    def get_int(self, key: str, default: int | None = None) -> int | None:
        value = self.value(key)
        if value is None or value == "":
            return default
        try:
            return int(float(value)) if isinstance(value, str) else int(value)
        except (TypeError, ValueError):
            raise ValueError(f"{key}: expected a number, got {value!r} ({self.where(key)})") from None

    def get_float(self, key: str, default: float | None = None) -> float | None:
        value = self.value(key)
        if value is None or value == "":
            return default
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{key}: expected a number, got {value!r} ({self.where(key)})") from None

    def get_bool(self, key: str, default: bool) -> bool:
        value = self.value(key)
        if value is None:
            return default
        if isinstance(value, str):
            return value.lower() in ("true", "1", "yes")
        return bool(value)

    def path(self, key: str) -> Path | None:
        """A path setting, resolved against the OneTrainer root (the run's cwd)."""
        value = self.value(key)
        if not value or not isinstance(value, str):
            return None
        p = Path(value).expanduser()
        return Path(os.path.normpath(p if p.is_absolute() else self.cwd / p))

    # --- editing -----------------------------------------------------------------------------
    def set(self, key: str, value: Any) -> None:
        self.overrides[key] = value

    def derived(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """The config an attempt runs with: the accepted user config, every remedy, ``extra``."""
        doc = copy.deepcopy(self.doc)
        for key, value in {**self.overrides, **(extra or {})}.items():
            set_dotted(doc, key, value)
        return doc

    def launch_argv(self, config: Path, keys: AbstractSet[str]) -> list[str]:
        """The command with ``--config-path`` at ``config`` and no ``--config-value`` of ``keys``
        (their value is in the derived copy)."""
        out = list(self.argv[: self.script_at + 1])
        rest = self.argv[self.script_at + 1:]
        i = 0
        while i < len(rest):
            token = rest[i]
            name, eq, inline = token.partition("=")
            if name in (_PATH_FLAG, _VALUE_FLAG):
                value = inline if eq else (rest[i + 1] if i + 1 < len(rest) else "")
                i += 1 if eq else 2
                if name == _PATH_FLAG:
                    continue
                if split_value(value)[0] in keys:
                    continue
                out += [_VALUE_FLAG, value]
                continue
            out.append(token)
            i += 1
        return [*out, _PATH_FLAG, str(config)]

    def command_line(self) -> list[str]:
        """As the user would type it without trainsup: the remedies as ``--config-value`` overrides."""
        keys = set(self.overrides)
        argv = self.launch_argv(self.config_path, keys)
        for key, value in self.overrides.items():
            text = json.dumps(value) if not isinstance(value, str) else value
            argv += [_VALUE_FLAG, f"{key}={text.lower() if isinstance(value, bool) else text}"]
        return argv


def _flag_values(tokens: list[str], flag: str) -> list[str]:
    found: list[str] = []
    for i, token in enumerate(tokens):
        if token == flag and i + 1 < len(tokens):
            found.append(tokens[i + 1])
        elif token.startswith(flag + "="):
            found.append(token[len(flag) + 1:])
    return found
