"""Owns asking the trainer's own interpreter which package versions it has, and comparing versions.

The interpreter that runs the trainer (often a venv behind ``accelerate launch``) is not the
supervisor's, so it is asked in a subprocess: a tiny ``-c`` script reads ``importlib.metadata`` (no
package is imported, so it takes a fraction of a second even where torch takes ten) and prints
JSON.  A package that is not installed is reported as ``None``; a probe that fails or times out
is an error string, never an exception.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["PACKAGES", "Probe", "at_least", "parse_version", "probe_versions"]

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
