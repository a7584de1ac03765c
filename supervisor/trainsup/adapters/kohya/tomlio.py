"""Owns reading kohya TOML configs and writing derived copies of them (never the user's file).

kohya flattens ``--config_file`` sections, so a key may sit in any table; a ``--dataset_config``
nests ``[[datasets]]`` and ``[[datasets.subsets]]`` arrays of tables. A flag set ``true`` in a
config cannot be switched off from the command line: removing it means writing a derived TOML into
the run directory and pointing the trainer at it. Values are read with the standard library's
``tomllib``; derived copies are written with ``tomlkit`` from the text the values were read from,
so they keep the user's comments, layout and every TOML shape (arrays of tables, inline tables,
dotted keys, multi-line strings, datetimes), minus exactly the keys a remedy removed.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path
from typing import Any

import tomlkit
import tomlkit.exceptions
from tomlkit.items import Item

from ...record.textfile import NotTextError, read_text


class ConfigFileError(ValueError):
    pass


class TomlDoc(dict[str, Any]):
    """A TOML file's values (plain Python, as ``tomllib`` reads them) and the text they came from."""

    def __init__(self, values: Mapping[str, Any], source: str) -> None:
        super().__init__(values)
        self.source = source


def parse_toml(text: str, where: str) -> TomlDoc:
    try:
        return TomlDoc(tomllib.loads(text), text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigFileError(f"{where}: invalid TOML: {exc}") from None


def read_toml(path: Path) -> TomlDoc:
    try:
        text = read_text(path, "TOML file", boms=False)  # TOML is UTF-8, and kohya reads it so
    except FileNotFoundError:
        raise ConfigFileError(f"{path}: config file not found") from None
    except IsADirectoryError:
        raise ConfigFileError(f"{path}: is a directory, not a TOML file") from None
    except PermissionError:
        raise ConfigFileError(f"{path}: permission denied") from None
    except NotTextError as exc:
        raise ConfigFileError(str(exc)) from None
    return parse_toml(text, str(path))


def flat_keys(doc: Mapping[str, Any]) -> dict[str, Any]:
    """kohya's view of a ``--config_file``: every leaf key, whatever table it sits in (later tables
    win, like kohya)."""
    out: dict[str, Any] = {}
    for key, value in doc.items():
        if isinstance(value, dict):
            out.update(flat_keys(value))
        else:
            out[key] = value
    return out


def keys_anywhere(doc: object) -> set[str]:
    """Every key of a document, in tables, inline tables and arrays of tables alike."""
    found: set[str] = set()
    if isinstance(doc, dict):
        for key, value in doc.items():
            found.add(key)
            found |= keys_anywhere(value)
    elif isinstance(doc, list):
        for item in doc:
            found |= keys_anywhere(item)
    return found


def values_of(doc: object, key: str) -> list[Any]:
    """Every value of ``key``, wherever it sits (each dataset's ``batch_size``, say)."""
    out: list[Any] = []
    if isinstance(doc, dict):
        for k, v in doc.items():
            if k == key and not isinstance(v, (dict, list)):
                out.append(v)
            else:
                out.extend(values_of(v, key))
    elif isinstance(doc, list):
        for item in doc:
            out.extend(values_of(item, key))
    return out


Edit = Callable[[Any], Any]


def derive(doc: TomlDoc, remove: set[str] | frozenset[str] = frozenset(),
           edits: Mapping[str, Edit] | None = None) -> str:
    """The text of a derived copy of ``doc``: its source with ``remove`` keys dropped from every
    table and ``edits[key](value)`` replacing every value of an edited key; nothing else changes."""
    edits = edits or {}
    if not remove and not edits:
        return doc.source
    expected = _edited(without_keys(doc, remove), edits)
    try:
        parsed = tomlkit.parse(doc.source)
        _walk(parsed, remove, edits)
        text = tomlkit.dumps(parsed)
        if _pruned(tomllib.loads(text)) == _pruned(expected):
            return text
    except (tomlkit.exceptions.TOMLKitError, tomllib.TOMLDecodeError, LookupError, ValueError, TypeError):
        pass  # tomlkit could not edit this layout in place (it has trouble with some dotted keys)
    # The values are what the trainer reads: write them plainly, the user's comments aside.
    return tomlkit.dumps(expected)


def _edited(value: Any, edits: Mapping[str, Edit]) -> Any:
    if isinstance(value, dict):
        return {k: edits[k](v) if k in edits and not isinstance(v, (dict, list)) else _edited(v, edits)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_edited(v, edits) for v in value]
    return value


def _pruned(value: Any) -> Any:
    """A document without empty tables: a table that only dotted keys made vanishes with its last
    key, and kohya reads no difference."""
    if isinstance(value, dict):
        kept = {k: _pruned(v) for k, v in value.items()}
        return {k: v for k, v in kept.items() if v != {}}
    if isinstance(value, list):
        return [_pruned(v) for v in value]
    return value


def _walk(node: object, remove: set[str] | frozenset[str], edits: Mapping[str, Edit]) -> None:
    # tomlkit's tables (documents, [tables], inline tables, the proxies it makes for dotted keys
    # and tables split across the file) are mappings; arrays and arrays of tables are lists.
    if isinstance(node, MutableMapping):
        for key in reversed(list(node.keys())):
            value = node[key]
            if key in remove:
                del node[key]
            elif key in edits and not isinstance(value, (MutableMapping, list)):
                node[key] = edits[key](value.unwrap() if isinstance(value, Item) else value)
            else:
                _walk(value, remove, edits)
    elif isinstance(node, list):
        for item in node:
            _walk(item, remove, edits)


def without_keys(doc: Mapping[str, Any], names: set[str] | frozenset[str]) -> dict[str, Any]:
    """The values a derived copy holds: ``doc`` without ``names`` in any table (a pure reference
    for ``derive``, and what kohya will read)."""
    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in names}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    result: dict[str, Any] = strip(dict(doc))
    return result
