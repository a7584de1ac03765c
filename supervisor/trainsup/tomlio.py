"""Owns reading kohya TOML configs and writing derived copies (never the user's file).

kohya flattens ``--config_file`` sections, so a key may sit in any table. A flag set ``true`` there
cannot be switched off from the command line; removing it means writing a derived TOML into the run
directory and pointing ``--config_file`` at it. The writer covers what kohya configs hold: tables of
strings, numbers, booleans and flat arrays of those.
"""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path
from typing import Any


class ConfigFileError(ValueError):
    pass


def read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigFileError(f"{path}: config file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigFileError(f"{path}: invalid TOML: {exc}") from None


def flat_keys(doc: dict[str, Any]) -> dict[str, Any]:
    """kohya's view: every leaf key, whatever table it sits in (later tables win, like kohya)."""
    out: dict[str, Any] = {}
    for key, value in doc.items():
        if isinstance(value, dict):
            out.update(flat_keys(value))
        else:
            out[key] = value
    return out


def without_keys(doc: dict[str, Any], names: set[str]) -> tuple[dict[str, Any], list[str]]:
    """A copy of ``doc`` with the keys removed from every table, and the dotted paths removed."""
    removed: list[str] = []

    def walk(table: dict[str, Any], prefix: str) -> dict[str, Any]:
        kept: dict[str, Any] = {}
        for key, value in table.items():
            if isinstance(value, dict):
                kept[key] = walk(value, f"{prefix}{key}.")
            elif key in names:
                removed.append(prefix + key)
            else:
                kept[key] = value
        return kept

    return walk(doc, ""), removed


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        # A JSON string literal is a valid TOML basic string for every character JSON escapes.
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_scalar(v) for v in value) + "]"
    raise ConfigFileError(f"cannot write a TOML value of type {type(value).__name__}: {value!r}")


def dumps(doc: dict[str, Any]) -> str:
    lines: list[str] = []

    def emit(table: dict[str, Any], path: list[str]) -> None:
        scalars = [(k, v) for k, v in table.items() if not isinstance(v, dict)]
        tables = [(k, v) for k, v in table.items() if isinstance(v, dict)]
        if path and (scalars or not tables):
            lines.append("[" + ".".join(json.dumps(p) for p in path) + "]")
        for key, value in scalars:
            lines.append(f"{json.dumps(key)} = {_scalar(value)}")
        if scalars:
            lines.append("")
        for key, value in tables:
            emit(value, [*path, key])

    emit(doc, [])
    return "\n".join(lines).rstrip() + "\n"
