"""Owns a ``--config FILE.yaml`` of a LitGPT command: reading the keys it sets, and writing the
derived copy a remedy needs when it changes a key set there (the user's file is never touched).

jsonargparse reads the file as nested mappings (``train: {max_steps: 20}``) or dotted keys
(``train.max_steps: 20``, seen on the bed), and a class-typed group such as ``data`` keeps its
settings under ``init_args`` (``--data.num_workers`` is ``data.init_args.num_workers``). Keys here are
the flag names without dashes, as the command line spells them.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ...record.fsutil import atomic_write_text
from ...record.textfile import read_text

_DELETE = object()  # an override that removes the key


def _lookup(doc: Any, parts: list[str]) -> tuple[bool, Any]:
    """(found, value) of a dotted key in nested mappings, also looking under ``init_args``."""
    if not parts:
        return True, doc
    if not isinstance(doc, dict):
        return False, None
    # a flat dotted key wins where it exists (jsonargparse applies it as given)
    for n in range(len(parts), 0, -1):
        head = ".".join(parts[:n])
        if head in doc:
            found, value = _lookup(doc[head], parts[n:])
            if found:
                return found, value
    if isinstance(doc.get("init_args"), dict):
        return _lookup(doc["init_args"], parts)
    return False, None


def _place(doc: dict[str, Any], parts: list[str], value: Any) -> bool:
    """Set (or delete, for ``_DELETE``) an existing dotted key where ``_lookup`` finds it."""
    for n in range(len(parts), 0, -1):
        head = ".".join(parts[:n])
        if head not in doc:
            continue
        if n == len(parts):
            if value is _DELETE:
                del doc[head]
            else:
                doc[head] = value
            return True
        if isinstance(doc[head], dict) and _place(doc[head], parts[n:], value):
            return True
    inner = doc.get("init_args")
    return isinstance(inner, dict) and _place(inner, parts, value)


def yaml_value(text: str) -> Any:
    """A command-line value as YAML would type it (``20`` -> 20, ``true`` -> True, ``x`` -> 'x')."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def as_flag_text(value: Any) -> str | None:
    """A config value as the command line would spell it."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass
class ConfigFile:
    path: Path  # the user's file, never written
    doc: dict[str, Any]
    overrides: dict[str, Any] = field(default_factory=dict)  # key -> new value (or _DELETE)

    @classmethod
    def load(cls, path: Path) -> ConfigFile:
        """Raises OSError (unreadable) or ValueError (not a YAML mapping), naming the file."""
        text = read_text(path, "config file", boms=False)  # NotTextError is a ValueError naming the file
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ValueError(f"{path}: not valid YAML: {exc}") from None
        if doc is None:
            doc = {}
        if not isinstance(doc, dict):
            raise ValueError(f"{path}: expected a mapping of settings, got {type(doc).__name__}")  # noqa: TRY004 - a bad file
        return cls(path, doc)

    def copy(self) -> ConfigFile:
        return ConfigFile(self.path, self.doc, dict(self.overrides))

    def has(self, key: str) -> bool:
        if key in self.overrides:
            return self.overrides[key] is not _DELETE
        return _lookup(self.doc, key.split("."))[0]

    def get(self, key: str) -> str | None:
        if key in self.overrides:
            value = self.overrides[key]
            return None if value is _DELETE else as_flag_text(value)
        found, value = _lookup(self.doc, key.split("."))
        return as_flag_text(value) if found else None

    def set(self, key: str, value: str) -> None:
        self.overrides[key] = yaml_value(value)

    def delete(self, key: str) -> None:
        self.overrides[key] = _DELETE

    @property
    def changed(self) -> bool:
        return bool(self.overrides)

    def applied(self) -> dict[str, Any]:
        """The file's settings with the overrides applied."""
        doc = copy.deepcopy(self.doc)
        for key, value in self.overrides.items():
            if not _place(doc, key.split("."), value) and value is not _DELETE:
                doc[key] = value  # a flat dotted key: jsonargparse reads it as the flag
        return doc

    def derive(self) -> str:
        """The derived copy's text (comments are not kept: its head says where it comes from and what
        changed)."""
        changes = ", ".join(f"{k} removed" if v is _DELETE else f"{k}: {as_flag_text(v)}"
                            for k, v in self.overrides.items())
        head = f"# derived by trainsup from {self.path} ({changes})\n"
        return head + str(yaml.safe_dump(self.applied(), sort_keys=False, default_flow_style=False))

    def write_derived(self, target: Path) -> None:
        atomic_write_text(target, self.derive())
