"""Owns what one supervised run is asked to do (``RunSpec``) and the environment rules of its child:
what trainsup sets for every trainer unless the user did, and what is trainsup's alone."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..record.runlock import INHERITED_FD
from .project import Project

CHILD_ENV_DEFAULTS = {"COLUMNS": "250", "PYTHONUNBUFFERED": "1"}
SUPERVISOR_ONLY_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", INHERITED_FD,
                       "TRAINSUP_HANDED_OVER_RUN_DIR")  # trainsup's alone (the last: run.rundir)


@dataclass(frozen=True)
class RunSpec:
    argv: tuple[str, ...]
    cwd: Path
    run_dir: Path | None = None
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    echo: bool = True  # pass the child's output through to our stdout/stderr
    policy_path: Path | None = None  # watched: an edit of the policy applies to the running supervisor
    project: Project | None = None  # run from a project file (policy_path is that file)
    trainer: str | Mapping[str, Any] | None = None  # the adapter to use (a name, or a declarative section)
    start: Literal["auto", "fresh", "resume"] = "auto"  # --fresh / --resume (run.rundir)
