"""Owns what a ``status``/``logs``/``stop`` argument names, and reading a run dir's status snapshot.

An argument is a run dir (a directory holding ``status.json``, ``lock`` or ``events.jsonl``), an
output dir whose ``.trainsup/`` is one, or a project (a name in the projects directory, or a project
file). The run dir is tried first: it is what ``trainsup run`` prints and what a user copies. A
project file that exists but cannot be loaded still names a run (whose state is then unknown), so
that ``trainsup status`` lists every project even when one of them is broken.

``status.json`` is replaced atomically by the supervisor, so a reader never sees half of it; a file
that is missing, unreadable or not a JSON object is reported as a reason, never raised.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..record.identity import candidates
from ..run.project import ProjectError, find_project, list_projects, load_project, project_name, projects_dir

__all__ = ["RefError", "RunRef", "attempt_logs", "every_project", "is_run_dir", "read_status", "resolve"]

RUN_DIR_MARKERS = ("status.json", "lock", "events.jsonl")
_LOG_NAME = re.compile(r"attempt-(\d+)\.log")


class RefError(ValueError):
    """An argument that names neither a run dir nor a project."""


@dataclass(frozen=True)
class RunRef:
    name: str  # the project's name, or the run dir as the user typed it
    run_dir: Path | None  # None only when ``problem`` says why
    project: Path | None = None  # the project file, when the run was named through one
    problem: str | None = None  # a project file that could not be loaded

    def usable(self) -> Path:
        """The run dir, or ``RefError`` for a project that could not be loaded."""
        if self.run_dir is None:
            raise RefError(self.problem or f"{self.name}: no run dir")
        return self.run_dir


def is_run_dir(path: Path) -> bool:
    return path.is_dir() and any((path / marker).exists() for marker in RUN_DIR_MARKERS)


def resolve(arg: str, env: Mapping[str, str]) -> RunRef:
    """The run ``arg`` names, or ``RefError`` saying what it was tried as."""
    given = Path(arg).expanduser()
    if is_run_dir(given):
        return RunRef(arg, given.resolve())
    runs = [d for d in candidates(given / ".trainsup") if is_run_dir(d)]
    if runs:  # an output dir: its newest run (``.trainsup``, or a later run's ``.trainsup-NAME``)
        return RunRef(arg, max(runs, key=_last_written).resolve())
    try:
        path = find_project(arg, env)
    except ProjectError as exc:
        raise RefError(f"{arg}: neither a run dir (a directory with {', '.join(RUN_DIR_MARKERS[:-1])} or "
                       f"{RUN_DIR_MARKERS[-1]}) nor a project ({exc})") from None
    return _project_ref(path)


def _last_written(run_dir: Path) -> float:
    try:
        return max((run_dir / m).stat().st_mtime for m in RUN_DIR_MARKERS if (run_dir / m).exists())
    except (OSError, ValueError):
        return 0.0


def every_project(env: Mapping[str, str]) -> tuple[Path, list[RunRef]]:
    """The projects directory and a run for each project file in it, by name."""
    return projects_dir(env), [_project_ref(path) for path in list_projects(env)]


def _project_ref(path: Path) -> RunRef:
    try:
        project = load_project(path)
    except ProjectError as exc:
        return RunRef(project_name(path), None, path, str(exc))
    return RunRef(project.name, project.resolved_run_dir(), path)


def read_status(run_dir: Path) -> tuple[dict[str, Any] | None, str | None]:
    """``(snapshot, None)``; ``(None, None)`` when there is no ``status.json``; ``(None, why)`` when it
    cannot be used."""
    path = run_dir / "status.json"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, None
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}"
    try:
        data = json.loads(text)
    except ValueError as exc:
        return None, f"{path} is not valid JSON ({exc})"
    if not isinstance(data, dict):
        return None, f"{path} is not a JSON object"
    return data, None


def attempt_logs(run_dir: Path) -> dict[int, Path]:
    """Every ``attempt-N.log`` of the run dir by its attempt number (numbers, so 10 comes after 9)."""
    try:
        entries = list(run_dir.iterdir())
    except OSError:
        return {}
    found = {}
    for path in entries:
        match = _LOG_NAME.fullmatch(path.name)
        if match and path.is_file():
            found[int(match.group(1))] = path
    return found
