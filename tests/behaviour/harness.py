"""Running `trainsup run` over a bed's command, and reading what it left.

``supervise`` starts `trainsup run --quiet` the way the bed says (the user's command after ``--``
with a policy file, or a project file with a ``trainer:`` section), follows its journal and calls a
hook for each new event with a ``Ctx`` (trainsup's pid, and ``marks`` where the hook keeps what it
saw, e.g. a digest of the output dir at the moment of a kill).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import kept_after_move, trainsup_cmd
from trainsup.demo.story import follow
from trainsup.record.journal import read_events

# Short backoff (each restart is seen within a second), a stop grace long enough for a real trainer.
POLICY = "backoff:\n  initial_s: 0.5\n  max_s: 1\nstop:\n  grace_s: 10\n"


@dataclass(frozen=True)
class Launch:
    """How the user runs the trainer: the command, where and with what environment; ``trainer`` a
    project's declarative ``trainer:`` section (then trainsup runs a project file), else None (the
    command after ``--``, its adapter recognised from it)."""

    argv: list[str]
    cwd: Path
    env: dict[str, str]
    resumes: bool  # the trainer can resume from a state; False: a restart starts from step 0
    trainer: dict[str, Any] | None = None


@dataclass
class Ctx:
    pid: int  # trainsup's
    out: Path
    marks: dict[str, Any] = field(default_factory=dict)


Hook = Callable[[dict[str, Any], Ctx], None]


@dataclass
class Run:
    returncode: int
    stderr: str
    events: list[dict[str, Any]]
    run_dir: Path
    out: Path
    launch: Launch
    marks: dict[str, Any]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == kind]

    def starts(self) -> list[dict[str, Any]]:
        return self.of("attempt_start")

    def faults(self, attempt: int | None = None) -> list[str]:
        return [f["class"] for f in self.of("fault") if attempt is None or f["attempt"] == attempt]

    def log(self, attempt: int) -> Path:
        return self.run_dir / f"attempt-{attempt}.log"

    def log_text(self, attempt: int) -> str:
        return self.log(attempt).read_text(encoding="utf-8", errors="replace")


def trainsup_args(launch: Launch, tmp: Path, policy: str) -> list[str]:
    """`trainsup run` arguments for this launch: a project file when the bed declares its trainer."""
    if launch.trainer is None:
        pol = tmp / "policy.yaml"
        pol.write_text(policy)
        return ["--policy", str(pol), "--", *launch.argv]
    project = {"command": launch.argv, "cwd": str(launch.cwd), "env": {}, "trainer": launch.trainer,
               **yaml.safe_load(policy)}
    path = tmp / "project.yaml"
    path.write_text(json.dumps(project, indent=1))  # JSON is YAML
    return ["--project", str(path)]


def supervise(launch: Launch, out: Path, tmp: Path, hook: Hook | None = None, policy: str = POLICY,
              timeout: float = 900, run_dir: Path | None = None) -> Run:
    """``run_dir``: where this run's journal will be (default ``OUT/.trainsup``; another run's beside it
    goes to ``.trainsup-NAME``)."""
    tmp.mkdir(parents=True, exist_ok=True)
    run_dir = run_dir or out / ".trainsup"
    proc = subprocess.Popen(trainsup_cmd("run", "--quiet", *trainsup_args(launch, tmp, policy)), cwd=launch.cwd,
                            env=launch.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    ctx = Ctx(proc.pid, out)
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read() if proc.stderr else ""))
    reader.start()
    try:
        follow(proc, run_dir, None if hook is None else (lambda event: hook(event, ctx)), timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        reader.join()
    return Run(proc.returncode, "".join(err), read_events(run_dir), run_dir, out, launch, ctx.marks)


def digest_tree(out: Path) -> dict[str, str]:
    """sha256 of every file the run produced in ``out`` (trainsup's own run dir left out)."""
    found: dict[str, str] = {}
    for path in sorted(out.rglob("*")):
        rel = path.relative_to(out)
        if rel.parts[0].startswith(".trainsup") or not path.is_file():
            continue
        found[str(rel)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def changed_since(before: dict[str, str], run: Run) -> list[str]:
    """Files of ``before`` whose bytes changed or that are gone. A save that trainsup moved out of
    the output dir's sight counts as kept when its files are whole where it went."""
    now = digest_tree(run.out)
    return [rel for rel, digest in before.items()
            if now.get(rel) != digest and not kept_after_move(run.out / rel, digest, run.events)]
