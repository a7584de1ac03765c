"""Owns project files: one YAML per training project, found by name in the projects directory.

A project file is a policy (every section of ``config.example.yaml``) plus what to run:
``command:`` (a list of argv strings, or one string split the shell's way), ``cwd:``, ``env:`` (a
map), ``gpus:`` (sets ``CUDA_VISIBLE_DEVICES``), ``run_dir:`` and ``description:``. Errors name the
file and line like the policy's. The file is UTF-8 (a byte-order mark is honoured: Notepad's UTF-16
works); anything else is refused naming the byte at fault (see ``record.textfile``). Relative paths
are taken from the project file's directory (``cwd``) and from ``cwd`` (``run_dir``).

The projects directory is ``$TRAINSUP_PROJECTS``, else ``/etc/trainsup/projects`` for root and
``$XDG_CONFIG_HOME/trainsup/projects`` (``~/.config/trainsup/projects``) for anyone else; the
project ``NAME`` is the file ``NAME.yaml`` (or ``NAME.yml``) there.

``trainer:`` names the adapter that runs the command (``kohya``, ``litgpt``, ``command``, ...) when
recognising it is not enough, or is a mapping that describes the trainer's states and lines for the
declarative adapter (checked by that adapter when the run starts).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..record.textfile import NotTextError, read_text
from ..trainers.base import Setup, UsageError
from ..trainers.registry import open_run
from .policy import Policy, PolicyError, parse_policy
from .rundir import this_runs_dir

PROJECT_KEYS = frozenset({"command", "cwd", "env", "gpus", "run_dir", "description", "trainer"})
SUFFIXES = (".yaml", ".yml")


class ProjectError(ValueError):
    pass


@dataclass(frozen=True)
class Project:
    name: str
    path: Path
    command: tuple[str, ...]
    cwd: Path
    env: Mapping[str, str] = field(default_factory=dict)  # on top of trainsup's own environment
    run_dir: Path | None = None
    description: str | None = None
    policy: Policy = field(default_factory=Policy)
    trainer: str | Mapping[str, Any] | None = None  # an adapter's name, or a declarative section

    def child_env(self, base: Mapping[str, str]) -> dict[str, str]:
        return {**base, **self.env}

    def resolved_run_dir(self, exact: bool = False) -> Path:
        """Where this project's runs keep their journal: ``run_dir:``, else the command's default (or,
        beside another run's records, its own: ``run.rundir.this_runs_dir``; ``exact`` for a queue entry)."""
        if self.run_dir is not None:
            return self.run_dir
        try:
            setup = Setup(self.command, self.cwd, self.policy.trainer_settings())
            return this_runs_dir(open_run(setup, self.trainer), None, self.cwd, exact)
        except (UsageError, OSError):
            return (self.cwd / ".trainsup").resolve()


def projects_dir(env: Mapping[str, str] = os.environ) -> Path:
    if env.get("TRAINSUP_PROJECTS"):
        return Path(env["TRAINSUP_PROJECTS"]).expanduser()
    if os.geteuid() == 0:
        return Path("/etc/trainsup/projects")
    config = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME") or Path.home()) / ".config")
    return Path(config) / "trainsup" / "projects"


def list_projects(env: Mapping[str, str] = os.environ) -> list[Path]:
    folder = projects_dir(env)
    try:
        return sorted(p for p in folder.iterdir() if p.suffix in SUFFIXES and p.is_file())
    except OSError:
        return []


def find_project(name_or_file: str, env: Mapping[str, str] = os.environ) -> Path:
    """A project file by path (anything with a ``/`` or a YAML suffix that exists) or by name."""
    given = Path(name_or_file).expanduser()
    if ("/" in name_or_file or given.suffix in SUFFIXES) and given.is_file():
        return given.resolve()
    if "/" not in name_or_file:
        folder = projects_dir(env)
        for suffix in ("", *SUFFIXES):
            candidate = folder / f"{name_or_file}{suffix}"
            if candidate.suffix in SUFFIXES and candidate.is_file():
                return candidate.resolve()
        if given.suffix in SUFFIXES:  # a file name: looked for here, then in the projects directory
            raise ProjectError(f"no project {name_or_file!r}: neither {given.absolute()} nor {folder / name_or_file} "
                               "exists")
        raise ProjectError(f"no project {name_or_file!r}: neither a file nor {folder / name_or_file}.yaml")
    raise ProjectError(f"no project file {name_or_file}")


def project_name(path: Path) -> str:
    return path.name[: -len(path.suffix)] if path.suffix in SUFFIXES else path.name


def load_project(path: Path) -> Project:
    try:
        text = read_text(path, "project file")
    except OSError as exc:
        raise ProjectError(f"{path}: cannot read the project file ({exc.strerror or exc})") from None
    except NotTextError as exc:
        raise ProjectError(str(exc)) from None
    return parse_project(text, path)


def parse_project(text: str, path: Path) -> Project:
    source = str(path)
    try:
        policy = parse_policy(text, source, PROJECT_KEYS)
    except PolicyError as exc:
        raise ProjectError(str(exc)) from None
    root = yaml.compose(text)  # parse_policy proved it well-formed and a mapping (or empty)
    nodes = {k.value: (k, v) for k, v in root.value} if isinstance(root, yaml.MappingNode) else {}
    if "command" not in nodes:
        raise ProjectError(f"{source}:1: command: missing; a project says what to run "
                           "(a list of argv strings, or one string)")
    values: dict[str, Any] = {}
    for key in PROJECT_KEYS & nodes.keys():
        key_node, value_node = nodes[key]
        raw = yaml.safe_load(yaml.serialize(value_node))
        try:
            values[key] = _CONVERT[key](raw)
        except TypeError as exc:
            raise ProjectError(f"{source}:{key_node.start_mark.line + 1}: {key}: expected {exc}, "
                               f"got {raw!r}") from None
    home = path.resolve().parent
    cwd = (home / values["cwd"]).resolve() if "cwd" in values else home
    env = dict(values.get("env", {}))
    if "gpus" in values:
        env["CUDA_VISIBLE_DEVICES"] = values["gpus"]
    run_dir = (cwd / values["run_dir"]).resolve() if "run_dir" in values else None
    return Project(project_name(path), path.resolve(), values["command"], cwd, env, run_dir,
                   values.get("description"), policy, values.get("trainer"))


def _command(v: Any) -> tuple[str, ...]:
    if isinstance(v, str):
        try:
            argv = shlex.split(v)
        except ValueError as exc:
            raise TypeError(f"a command the shell could split ({exc})") from None
    elif isinstance(v, list) and all(isinstance(a, (str, int, float)) and not isinstance(a, bool) for a in v):
        argv = [str(a) for a in v]
    else:
        raise TypeError("a list of argv strings, or one string")
    if not argv:
        raise TypeError("a non-empty command")
    return tuple(argv)


def _text(v: Any) -> str:
    if not isinstance(v, str) or not v:
        raise TypeError("a non-empty string")
    return v


def _env(v: Any) -> dict[str, str]:
    if not isinstance(v, dict):
        raise TypeError("a map of NAME: value")
    out = {}
    for name, value in v.items():
        if not isinstance(name, str) or not name or "=" in name:
            raise TypeError(f"variable names as keys ({name!r} is not one)")
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise TypeError(f"a string or number for {name}")
        out[name] = str(value)
    return out


def _trainer(v: Any) -> str | dict[str, Any]:
    if isinstance(v, str) and v:
        return v
    if isinstance(v, dict) and all(isinstance(k, str) for k in v):
        return v
    raise TypeError("an adapter's name (kohya, litgpt, command, ...) or a mapping for the declarative adapter")


def _gpus(v: Any) -> str:
    items = v if isinstance(v, list) else [v]
    if not items or any(isinstance(i, bool) or not isinstance(i, (str, int)) or str(i).strip() == ""
                        for i in items):
        raise TypeError("a GPU index or UUID, or a list of them")
    return ",".join(str(i).strip() for i in items)


_CONVERT = {"command": _command, "cwd": _text, "env": _env, "gpus": _gpus, "run_dir": _text,
            "description": _text, "trainer": _trainer}
