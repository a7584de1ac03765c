"""A throw-away real systemd for one test, through ``../shared/tools/systemd-sandbox``.

The tool boots systemd as PID 1 of a new pid+mount namespace with the files of a unit directory in
its /run/systemd/system. Its rules, which this helper keeps: the directory holds ``sandbox.target``,
every unit under test gets ``DefaultDependencies=no`` (a drop-in), output goes to a file (no
journald), one sandbox at a time, always stopped (a ``finally``). It needs root and ``unshare``;
``unavailable()`` says why it cannot run here, for a skip.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import ROOT

TOOL = ROOT.parent / "shared" / "tools" / "systemd-sandbox"
SANDBOX_TARGET = "[Unit]\nDescription=systemd-sandbox goal\nDefaultDependencies=no\n"


def unavailable() -> str | None:
    """Why no sandbox can run on this machine, or None."""
    if not TOOL.is_file():
        return f"no systemd sandbox tool at {TOOL}"
    if os.geteuid() != 0:
        return "the systemd sandbox needs root"
    for tool in ("unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"the systemd sandbox needs {tool}"
    if not Path("/lib/systemd/systemd").is_file():
        return "no systemd installed (/lib/systemd/systemd)"
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount", "true"], capture_output=True, text=True,
                           timeout=30, check=False)
    if probe.returncode != 0:
        return f"unshare --pid --mount is refused here: {probe.stderr.strip() or probe.returncode}"
    return None


@dataclass
class Sandbox:
    pid: str

    def ctl(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(["bash", str(TOOL), "ctl", self.pid, *args], capture_output=True, text=True,
                              timeout=timeout, check=False)
        if check and done.returncode != 0:
            raise AssertionError(f"systemctl {' '.join(args)}: exit {done.returncode}: "
                                 f"{done.stdout.strip()} {done.stderr.strip()}")
        return done

    def exec(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(TOOL), "exec", self.pid, *argv], capture_output=True, text=True,
                              timeout=timeout, check=False)

    def show(self, unit: str, *props: str) -> dict[str, str]:
        out = self.ctl("show", *(f"--property={p}" for p in props), unit).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


@contextlib.contextmanager
def sandbox(units: Path) -> Iterator[Sandbox]:
    """A systemd booted with ``units`` (which gets ``sandbox.target``); powered off on the way out."""
    (units / "sandbox.target").write_text(SANDBOX_TARGET)
    started = subprocess.run(["bash", str(TOOL), "start", str(units)], capture_output=True, text=True,
                             timeout=60, check=False)
    pid = started.stdout.strip()
    if started.returncode != 0 or not pid.isdigit():
        raise AssertionError(f"systemd-sandbox did not start: {started.stderr.strip()}")
    try:
        yield Sandbox(pid)
    finally:
        subprocess.run(["bash", str(TOOL), "stop", pid], capture_output=True, timeout=60, check=False)
