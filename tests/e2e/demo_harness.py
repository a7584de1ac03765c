"""Shared harness for end-to-end runs of `trainsup run` over the demo trainer.

Everything here is real: the demo trainer (torch on CPU) in child processes, trainsup as a
subprocess, files on disk. A watcher thread snapshots every state dir and weights file the moment
the journal records the first fault, so a test can prove none of them changed afterwards.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from safetensors.numpy import load_file

from tests.conftest import ROOT, kept_after_move, trainsup_cmd
from trainsup.demo.story import follow
from trainsup.record.journal import read_events

DEMO_ENV_KEYS = ("TRAINSUP_DEMO_SIMULATE", "TRAINSUP_DEMO_STEP_SECONDS")
FAST_POLICY = "backoff:\n  initial_s: 1.0\n  max_s: 2\nstop:\n  grace_s: 5\n"


def demo_argv(script: str, assets: dict[str, Path], out: Path, *extra: str, python: str = sys.executable,
              model: str = "model", steps: int = 20, save_every: int = 4) -> list[str]:
    return [python, "-m", f"trainsup.demo.{script}",
            "--pretrained_model_name_or_path", str(assets[model]),
            "--train_data_dir", str(assets["dataset"]), "--output_dir", str(out), "--output_name", "lora",
            "--max_train_steps", str(steps), "--save_every_n_steps", str(save_every), "--save_state",
            "--seed", "1234", "--train_batch_size", "2", "--learning_rate", "1e-3", *extra]


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DEMO_ENV_KEYS}
    env.update(extra)
    return env


def run_plain(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The demo trainer without trainsup (references, and proofs that a fault is real)."""
    return subprocess.run(argv, cwd=ROOT, env=env or clean_env(), capture_output=True, text=True, timeout=300,
                          check=False)


def weights(path: Path) -> dict[str, np.ndarray]:
    return load_file(str(path))


def assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = weights(a), weights(b)
    assert sorted(wa) == sorted(wb)
    for key in wa:
        np.testing.assert_allclose(wa[key], wb[key], rtol=1e-5, atol=1e-6, err_msg=key)


def visible_names(out: Path) -> list[str]:
    """What the user sees in an output dir: every name in it but trainsup's own run dir."""
    return sorted(p.name for p in out.iterdir() if p.name != ".trainsup")


def digest_tree(out: Path) -> dict[str, str]:
    """sha256 of every file under the state dirs and of every weights file in ``out``."""
    found: dict[str, str] = {}
    for path in sorted(out.rglob("*")):
        rel = path.relative_to(out)
        if rel.parts[0] in (".trainsup", "sample") or not path.is_file():
            continue
        found[str(rel)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


@dataclass
class SupervisedRun:
    returncode: int
    stdout: str
    stderr: str
    events: list[dict[str, Any]]
    run_dir: Path
    at_first_fault: dict[str, str] = field(default_factory=dict)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == kind]


def supervise(argv: list[str], out: Path, tmp: Path, env: dict[str, str] | None = None,
              policy: str = FAST_POLICY, on_event: Any = None, timeout: float = 300,
              cwd: Path = ROOT) -> SupervisedRun:
    """Run `trainsup run` over ``argv``; snapshot ``out`` at the first fault; call ``on_event`` for
    each new journal event while it runs (tests use it to edit files mid-run)."""
    pol = tmp / "policy.yaml"
    pol.write_text(policy)
    run_dir = out / ".trainsup"
    proc = subprocess.Popen(trainsup_cmd("run", "--quiet", "--policy", str(pol), "--", *argv), cwd=cwd,
                            env=env or clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    snapshot: dict[str, str] = {}
    streams: dict[str, str] = {}
    readers = [threading.Thread(target=lambda n=n, s=s: streams.__setitem__(n, s.read()))
               for n, s in (("out", proc.stdout), ("err", proc.stderr))]
    for r in readers:
        r.start()

    def watch(event: dict[str, Any]) -> None:
        if event["event"] == "fault" and not snapshot:
            snapshot.update(digest_tree(out))
        if on_event is not None:
            on_event(event)

    try:
        follow(proc, run_dir, watch, timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for r in readers:
            r.join()
    return SupervisedRun(proc.returncode, streams.get("out", ""), streams.get("err", ""), read_events(run_dir),
                         run_dir, snapshot)


def assert_untouched(run: SupervisedRun, out: Path) -> None:
    """Every state/weights file that existed at the first fault is byte-identical now (where it is,
    or where trainsup moved it out of sight: journal ``state_set_aside``, ``save_hidden``)."""
    assert run.at_first_fault, "no snapshot was taken: the journal recorded no fault"
    now = digest_tree(out)
    for rel, digest in run.at_first_fault.items():
        assert now.get(rel) == digest or kept_after_move(out / rel, digest, run.events), \
            f"{rel} was changed or removed after the fault"


def copy_state(src_out: Path, dst_out: Path, step: int) -> Path:
    """Give a fresh output dir the user's earlier state (and its weights) at ``step``."""
    dst_out.mkdir(parents=True, exist_ok=True)
    name = f"lora-step{step:08d}"
    shutil.copytree(src_out / f"{name}-state", dst_out / f"{name}-state")
    shutil.copy2(src_out / f"{name}.safetensors", dst_out / f"{name}.safetensors")
    return dst_out / f"{name}-state"


def finished_attempt(run: SupervisedRun) -> dict[str, Any]:
    last = run.of("attempt_start")[-1]
    return last


def alive_pids(pids: list[int]) -> list[int]:
    """The pids of ``pids`` whose processes still run (a zombie has ended)."""
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.Error:
            continue
    return out


def cli(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """A `trainsup` verb as a user runs it (from the repository root), its output kept."""
    return subprocess.run(trainsup_cmd(*args), cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def status_of(arg: str, env: dict[str, str]) -> dict[str, Any]:
    """`trainsup status --json ARG` of one run."""
    done = cli("status", "--json", arg, env=env)
    assert done.returncode == 0, done.stderr
    [entry] = json.loads(done.stdout)
    return dict(entry)
