"""Owns the Python interpreter that runs the trainer: finding it, asking its package versions,
and upgrading a package inside it.

The trainer often runs in its own venv, reached through ``accelerate launch`` or a venv's launch
script; the supervisor's interpreter is not the trainer's. The interpreter is the command's first
token when that is a python, else the python the ``#!`` line of the launcher script names
(``accelerate``, ``venv/bin/accelerate``); a script whose ``#!`` names no python (a shell script)
has none that can be told.

Versions are asked in a subprocess: a tiny ``-c`` script reads ``importlib.metadata`` (nothing is
imported, so it answers in a fraction of a second even where importing torch takes ten) and prints
JSON.  A package that is not installed is ``None``; a probe that fails or times out gives an error
string, never an exception.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
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
        parts = [p for p in parts[1:] if not p.startswith("-")][:1] or [""]
        if not _looks_python(parts[0]):
            return None
        return shutil.which(parts[0], path=path_var)
    return parts[0] if _looks_python(parts[0]) else None  # a shell script is not run by a Python


def _looks_python(path: str) -> bool:
    name = os.path.basename(path)
    return "python" in name or "pypy" in name


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


# --- package versions of the trainer's interpreter ---------------------------------------

PACKAGES = ("torch", "safetensors", "accelerate")
PROBE_TIMEOUT_S = 30.0

_SCRIPT = """
import json, sys
from importlib import metadata
out = {}
for name in sys.argv[1:]:
    try:
        out[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        out[name] = None
print(json.dumps({"python": sys.executable, "versions": out}))
"""

_RELEASE = re.compile(r"\s*v?(\d+(?:\.\d+)*)(.*)$")
_PRE = re.compile(r"^[-_.]?(?:a|b|c|rc|alpha|beta|pre|preview|dev)\d*", re.IGNORECASE)


@dataclass(frozen=True)
class Probe:
    python: str
    versions: dict[str, str | None] = field(default_factory=dict)  # None: not installed
    error: str | None = None  # why the interpreter could not be asked


def probe_versions(python: str, packages: Sequence[str] = PACKAGES, env: Mapping[str, str] | None = None,
                   timeout: float = PROBE_TIMEOUT_S) -> Probe:
    """Ask ``python`` for its versions of ``packages``."""
    try:
        proc = subprocess.run([python, "-c", _SCRIPT, *packages], capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL, env=dict(env) if env else None,
                              check=False)
    except subprocess.TimeoutExpired:
        return Probe(python, error=f"{python} did not answer within {timeout:g} s")
    except OSError as exc:
        return Probe(python, error=f"cannot run {python}: {exc.strerror or exc}")
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return Probe(python, error=f"{python} failed (exit {proc.returncode}): {last}")
    try:
        data = json.loads(proc.stdout.strip().splitlines()[-1])
        versions = {str(k): (None if v is None else str(v)) for k, v in data["versions"].items()}
    except (ValueError, KeyError, IndexError, AttributeError):
        return Probe(python, error=f"{python} answered something unexpected: {proc.stdout.strip()[:200]!r}")
    return Probe(python, versions)


def parse_version(text: str) -> tuple[tuple[int, ...], bool] | None:
    """``(release, is_prerelease)`` of a version string (``2.13.0+cpu`` -> ``((2, 13, 0), False)``).

    Enough of PEP 440 for the bounds checked here; None when the string has no release number.
    """
    m = _RELEASE.match(text)
    if m is None:
        return None
    release = tuple(int(p) for p in m.group(1).split("."))
    return release, _PRE.match(m.group(2)) is not None


def at_least(version: str, bound: tuple[int, ...]) -> bool | None:
    """Whether ``version`` >= ``bound`` (a pre-release of the bound is below it); None if unparsable."""
    parsed = parse_version(version)
    if parsed is None:
        return None
    release, pre = parsed
    width = max(len(release), len(bound))
    padded = release + (0,) * (width - len(release))
    target = bound + (0,) * (width - len(bound))
    return padded > target or (padded == target and not pre)
