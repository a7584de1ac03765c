"""Owns finding the Python interpreter that runs the trainer, and upgrading a package inside it.

The trainer often runs in its own venv, reached through ``accelerate launch`` or a venv's launch
script; the supervisor's interpreter is not the trainer's. The interpreter is the command's first
token when that is a python, else the ``#!`` line of the launcher script (``accelerate``,
``venv/bin/accelerate``).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")


def trainer_python(launcher: list[str], env: dict[str, str] | None = None) -> str | None:
    if not launcher:
        return None
    path_var = (env or os.environ).get("PATH")
    first = launcher[0]
    resolved = shutil.which(first, path=path_var) if os.sep not in first else first
    if resolved is None:
        return None
    if _PYTHON.match(os.path.basename(first)):
        return resolved
    try:
        with open(resolved, "rb") as fh:
            head = fh.readline(512).decode("utf-8", "replace").strip()
    except OSError:
        return None
    if not head.startswith("#!"):
        return None
    parts = shlex.split(head[2:])
    if not parts:
        return None
    if os.path.basename(parts[0]) == "env" and len(parts) > 1:
        return shutil.which(parts[1], path=path_var)
    return parts[0]


def upgrade_command(python: str, spec: str) -> list[str]:
    return [python, "-m", "pip", "install", spec]


def run_upgrade(python: str, spec: str, log_path: Path) -> int:
    """Run pip in the trainer's interpreter; its output goes to the console and to ``log_path``."""
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(upgrade_command(python, spec), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        assert proc.stdout is not None
        while chunk := os.read(proc.stdout.fileno(), 65536):
            log.write(chunk)
            try:
                os.write(2, chunk)
            except OSError:
                pass
        return proc.wait()
