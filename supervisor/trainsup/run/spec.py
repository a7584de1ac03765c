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
NCCL_DUMPS = "nccl"  # RUN_DIR/nccl/: the flight recorder's dumps, one file per rank


def flight_recorder_env(run_dir: Path) -> dict[str, str]:
    """PyTorch's NCCL flight recorder for a launch of ranks: the last collectives of each rank kept in a
    ring buffer and dumped into the run dir when the watchdog times out, so that a hung collective says
    which rank was behind. Stack traces stay off: NVIDIA found the dump itself can deadlock with them.
    Defaults only: the user's own values win; ignored by gloo and by a run without NCCL."""
    return {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
            "TORCH_INCLUDE_STACK_TRACE": "0",
            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(run_dir / NCCL_DUMPS / "trace_")}
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
