"""Owns sample-prompt files: validating an edit before it can reach the trainer.

kohya reads ``--sample_prompts`` as ``.txt`` (one prompt a line, options after `` --``: ``--n``
negative, ``--w``/``--h`` size, ``--d`` seed, ``--s`` steps, ``--l`` CFG scale, ``--ss`` sampler,
``--g``/``--f``/``--cn``/``--am`` for some architectures; ``#`` starts a comment line), ``.toml``
(``[[prompt.subset]]`` tables under ``[prompt]``, whose keys they inherit) or ``.json`` (a list of objects).
An invalid file is rejected with its line, and the run keeps the snapshot it has. Which ``.txt``
options exist is the trainer's (``Dialect.prompt_options``: musubi-tuner has ``--fs``, ``--i`` ...).
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from ...record.textfile import NotTextError, decode_text
from .dialect import KOHYA, PromptOptions

_TOML_LINE = re.compile(r"line (\d+)")


@dataclass(frozen=True)
class PromptError(Exception):
    path: Path
    line: int | None
    reason: str

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else str(self.path)
        return f"{where}: {self.reason}"


def parse_prompt_file(path: Path, options: PromptOptions = KOHYA.prompt_options) -> list[str]:
    """The prompts the trainer would sample, or ``PromptError`` naming the line at fault."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise PromptError(path, None, "the prompt file is gone") from None
    except OSError as exc:
        raise PromptError(path, None, f"cannot read it ({exc.strerror or exc})") from None
    return parse_prompt_bytes(path, raw, options)


def parse_prompt_bytes(path: Path, raw: bytes, options: PromptOptions = KOHYA.prompt_options) -> list[str]:
    """The prompts in ``raw``, the content of ``path`` as read once (validate what you will use)."""
    try:
        text = decode_text(raw, path, "prompt file", boms=False)  # kohya reads it as UTF-8
    except NotTextError as exc:
        raise PromptError(path, exc.line, exc.reason) from None
    suffix = path.suffix.lower()
    if suffix == ".toml":
        return _from_toml(path, text)
    if suffix == ".json":
        return _from_json(path, text)
    return _from_txt(path, text, options)


def _from_txt(path: Path, text: str, known: PromptOptions) -> list[str]:
    integer = r"-?\d+" if known.negative_ints else r"\d+"
    prompts = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        prompt, *options = line.split(" --")
        if not prompt.strip():
            raise PromptError(path, number, "a line with options but no prompt text")
        for option in options:
            key, _, value = option.strip().partition(" ")
            key, value = key.lower(), value.strip()
            if key in known.ints:
                if not re.fullmatch(integer, value):
                    raise PromptError(path, number, f"--{key} expects an integer, got {value!r}")
            elif key in known.floats:
                try:
                    float(value)
                except ValueError:
                    raise PromptError(path, number, f"--{key} expects a number, got {value!r}") from None
            elif key not in known.texts:
                raise PromptError(path, number, f"unknown option --{key}")
        prompts.append(prompt.strip())
    if not prompts:
        raise PromptError(path, None, "no prompt in the file")
    return prompts


def _from_toml(path: Path, text: str) -> list[str]:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = _TOML_LINE.search(str(exc))
        raise PromptError(path, int(m.group(1)) if m else None, f"invalid TOML: {exc}") from None
    # kohya reads exactly `dict(**data["prompt"], **subset) for subset in data["prompt"]["subset"]`:
    # a [prompt] table whose keys are defaults for its [[prompt.subset]] tables; anything else crashes it.
    section = doc.get("prompt")
    if not isinstance(section, dict):
        raise PromptError(path, None, "expected a [prompt] table with [[prompt.subset]] tables (kohya's layout)")
    subsets = section.get("subset")
    if not isinstance(subsets, list) or not all(isinstance(s, dict) for s in subsets):
        raise PromptError(path, None, "expected [[prompt.subset]] tables under [prompt]")
    defaults = {k: v for k, v in section.items() if k != "subset"}
    return _entries(path, [{**defaults, **s} for s in subsets])


def _from_json(path: Path, text: str) -> list[str]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PromptError(path, exc.lineno, f"invalid JSON: {exc.msg}") from None
    return _entries(path, data)


def _entries(path: Path, entries: object) -> list[str]:
    if not isinstance(entries, list) or not entries:
        raise PromptError(path, None, "expected a non-empty list of prompts")
    prompts = []
    for i, entry in enumerate(entries):
        text = entry.get("prompt") if isinstance(entry, dict) else entry if isinstance(entry, str) else None
        if not isinstance(text, str) or not text.strip():
            raise PromptError(path, None, f"entry {i + 1} has no prompt text")
        prompts.append(text.strip())
    return prompts
