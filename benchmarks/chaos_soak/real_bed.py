"""The real mode's trainer: sd-scripts' train_network.py on the CPU bed of the real-trainer tests
(`tests/real/bed.py`, reused as is: `build_bed`, the user's command, its environment, and
`trainer_process`), the one bare reference run of a soak (`RealReference`), and how the soak tells
that bed's processes for one output dir in the process table (`is_trainer`, `bed_processes`).
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import time
from pathlib import Path
from typing import Protocol

import psutil

from .params import REAL_EXTRA

ROOT = Path(__file__).resolve().parents[2]


class Bed(Protocol):
    """What the soak uses of `tests.real.bed.Bed`."""

    @property
    def sd_scripts(self) -> Path: ...

    def command(self, out: Path, *extra: str) -> list[str]: ...

    def env(self, **extra: str) -> dict[str, str]: ...


def _bed_module() -> object:
    """`tests.real.bed`, imported at run time (run as `python benchmarks/chaos.py`, the repo root is not
    on the path; and the type checker of benchmarks/ is not the tests' one)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module("tests.real.bed")


def build_bed() -> Bed | str:
    """The bed, built if needed (seconds when it is); or why the real mode cannot run here."""
    found: Bed | str = getattr(_bed_module(), "build_bed")()  # noqa: B009 - a module typed only at run time
    return found


def trainer_process(root_pid: int) -> psutil.Process | None:
    """The python running train_network.py under ``root_pid`` (accelerate's child, not accelerate)."""
    proc: psutil.Process | None = getattr(_bed_module(), "trainer_process")(root_pid)  # noqa: B009
    return proc


__all__ = ["Bed", "RealReference", "bed_processes", "build_bed", "is_trainer", "trainer_process", "visible_names"]


def is_trainer(cmd: list[str], out: str) -> bool:
    """train_network.py itself on this output dir (or its data loader worker, which carries its argv);
    not accelerate's launcher, nor trainsup (whose argv holds the command after `--`)."""
    return len(cmd) > 1 and Path(cmd[1]).name == "train_network.py" and out in cmd


def bed_processes(out: Path) -> list[psutil.Process]:
    """Every process whose argv runs train_network.py on ``out``: trainsup, accelerate, the trainer
    and its workers (what the soak itself started, through trainsup, for this run)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if (str(out) in cmd and any(Path(a).name == "train_network.py" for a in cmd)
                and proc.pid != psutil.Process().pid):
            found.append(proc)
    return found


def visible_names(out: Path) -> list[str]:
    """What the user sees in an output dir: every name in it but trainsup's own run dir."""
    try:
        return sorted(p.name for p in out.iterdir() if p.name != ".trainsup")
    except OSError:
        return []


class RealReference:
    """ONE bare run of the bed's command (with `REAL_EXTRA`, no trainsup), made once per soak and kept
    in the soak's work dir: the output dir every supervised run must end equal to."""

    def __init__(self, work: Path, bed: Bed) -> None:
        self.bed = bed
        self.dir = work / "reference"
        self.runs = 0
        self.seconds = 0.0
        self._out: Path | None = None

    def argv(self, out: Path) -> list[str]:
        return self.bed.command(out, *REAL_EXTRA)

    @property
    def out(self) -> Path:
        if self._out is None:
            out = self.dir / "out"
            self.dir.mkdir(parents=True, exist_ok=True)
            began = time.monotonic()
            with open(self.dir / "train.log", "wb") as log:
                done = subprocess.run(self.argv(out), cwd=self.bed.sd_scripts, env=self.bed.env(), stdout=log,
                                      stderr=subprocess.STDOUT, timeout=1200, check=False)
            self.runs, self.seconds = 1, time.monotonic() - began
            if done.returncode != 0:
                tail = (self.dir / "train.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the reference run failed ({done.returncode}): {tail}")
            self._out = out
        return self._out
