"""Project files end to end, and a supervisor that dies: `trainsup run --project` over the demo
trainer, SIGKILL of trainsup itself (its trainer must not train on unseen, and the next supervisor
of the project must stop whatever is left before it resumes), and an edited project command taken
over by a new supervisor at the next checkpoint. All real processes and signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import trainsup_cmd, wait_until
from tests.e2e.demo_harness import alive_pids, assert_same_weights, clean_env, demo_argv, run_plain
from trainsup.record.journal import read_events
from trainsup.record.runlock import holder


def _project(tmp_path: Path, assets: dict[str, Path], env: dict[str, str], extra: str = "") -> Path:
    projects = tmp_path / "projects"
    projects.mkdir(exist_ok=True)
    path = projects / "demo.yaml"
    command = demo_argv("train_network", assets, tmp_path / "out")
    path.write_text(f"description: the demo trainer\ncommand: {json.dumps(command)}\nenv: {json.dumps(env)}\n"
                    f"run_dir: {tmp_path / 'run'}\nbackoff:\n  initial_s: 1\nstop:\n  grace_s: 5\n{extra}")
    return path


def _start(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    env = clean_env(TRAINSUP_PROJECTS=str(tmp_path / "projects"))
    return subprocess.Popen(trainsup_cmd("run", "--quiet", *args), cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _events(tmp_path: Path, kind: str) -> list[dict[str, Any]]:
    try:
        return [e for e in read_events(tmp_path / "run") if e["event"] == kind]
    except (OSError, ValueError):
        return []


def _trainer_pids(supervisor_pid: int) -> list[int]:
    return [p.pid for p in psutil.Process(supervisor_pid).children(recursive=True)]


@pytest.fixture
def reference(assets: dict[str, Path], tmp_path: Path) -> Path:
    ref = tmp_path / "reference"
    r = run_plain(demo_argv("train_network", assets, ref))
    assert r.returncode == 0, r.stderr[-2000:]
    return ref / "lora.safetensors"


def test_a_project_runs_by_name_and_takes_no_command_of_its_own(assets: dict[str, Path], tmp_path: Path,
                                                                  reference: Path) -> None:
    _project(tmp_path, assets, {})
    usage = _start(tmp_path, "--project", "demo", "--", "python", "train.py")
    _, err = usage.communicate(timeout=60)
    assert usage.returncode == 2 and err.startswith("trainsup run: error: --project takes the command")
    assert len(err.strip().splitlines()) == 1
    run = _start(tmp_path, "--project", "demo")
    _, err = run.communicate(timeout=240)
    assert run.returncode == 0, err[-2000:]
    assert _events(tmp_path, "finished") and not _events(tmp_path, "fault")
    assert_same_weights(tmp_path / "out" / "lora.safetensors", reference)


def test_a_killed_supervisors_trainer_dies_at_its_next_write_and_the_run_resumes(
        assets: dict[str, Path], tmp_path: Path, reference: Path) -> None:
    _project(tmp_path, assets, {"TRAINSUP_DEMO_STEP_SECONDS": "0.2"})
    first = _start(tmp_path, "--project", "demo")
    wait_until(lambda: any(e["step"] >= 8 for e in _events(tmp_path, "state_saved")), 120, what="step 8 saved")
    trainer = _trainer_pids(first.pid)
    assert trainer
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=30)
    killed = time.monotonic()
    # Outside systemd nothing kills the orphan but its own next write to the closed pipe: one step.
    wait_until(lambda: not alive_pids(trainer), 10, what="the orphaned trainer to die")
    # the documented bound (docs/guides/robustness.md): the trainer's next output line
    assert time.monotonic() - killed < 3
    second = _start(tmp_path, "--project", "demo")
    _, err = second.communicate(timeout=240)
    assert second.returncode == 0, err[-2000:]
    (lost,) = [e for e in _events(tmp_path, "attempt_end") if e.get("supervisor_lost")]
    assert lost["attempt"] == 1
    start = _events(tmp_path, "attempt_start")[-1]
    assert start["attempt"] == 2 and start["resume_step"] >= 8
    assert_same_weights(tmp_path / "out" / "lora.safetensors", reference)


def test_a_silent_trainer_left_by_a_killed_supervisor_is_stopped_before_anything_else(
        assets: dict[str, Path], tmp_path: Path, reference: Path) -> None:
    # hang@7: silent from step 7 on (once per output dir), so no write ever meets the closed pipe
    _project(tmp_path, assets, {"TRAINSUP_DEMO_SIMULATE": "hang@7", "TRAINSUP_DEMO_STEP_SECONDS": "0.1"},
             "hang:\n  min_timeout_s: 600\n")
    first = _start(tmp_path, "--project", "demo")
    wait_until(lambda: any(e["step"] >= 4 for e in _events(tmp_path, "state_saved")), 120, what="step 4 saved")
    time.sleep(1.5)  # into the silent hang
    trainer = _trainer_pids(first.pid)
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=30)
    time.sleep(1)
    assert alive_pids(trainer), "the silent trainer should have outlived its supervisor"
    second = _start(tmp_path, "--project", "demo")
    try:
        wait_until(lambda: _events(tmp_path, "attempt_start")[1:], 60, what="the second supervisor's launch")
        assert not alive_pids(trainer)  # stopped before the new trainer started: never two on one output dir
        _, err = second.communicate(timeout=240)
    finally:
        for pid in alive_pids(trainer):
            os.kill(pid, signal.SIGKILL)
    assert second.returncode == 0, err[-2000:]
    (stopped,) = _events(tmp_path, "orphan_stopped")
    assert set(stopped["pids"]) == set(trainer)
    assert stopped["ts"] < _events(tmp_path, "attempt_start")[1]["ts"]
    assert _events(tmp_path, "attempt_start")[1]["resume_step"] == 4
    assert_same_weights(tmp_path / "out" / "lora.safetensors", reference)


def test_an_edited_project_command_is_taken_over_by_a_new_supervisor_at_the_next_checkpoint(
        assets: dict[str, Path], tmp_path: Path, reference: Path) -> None:
    path = _project(tmp_path, assets, {"TRAINSUP_DEMO_STEP_SECONDS": "0.3"})
    run = _start(tmp_path, "--project", "demo")
    wait_until(lambda: _events(tmp_path, "state_saved"), 120, what="a first state")
    gaps: list[float] = []

    def watch_lock() -> None:
        # The run dir's lock is held throughout the hand-over: status/stop never see it unsupervised.
        while True:
            if holder(tmp_path / "run") is None:
                if _events(tmp_path, "finished") or run.poll() is not None:
                    return  # the normal end: `finished` is journaled before the lock goes
                gaps.append(time.monotonic())
            time.sleep(0.005)

    watcher = threading.Thread(target=watch_lock)
    watcher.start()
    path.write_text(path.read_text().replace('"TRAINSUP_DEMO_STEP_SECONDS": "0.3"',
                                             '"TRAINSUP_DEMO_STEP_SECONDS": "0.05"'))
    _, err = run.communicate(timeout=240)
    watcher.join()
    assert gaps == []
    assert run.returncode == 0, err[-2000:]
    (handover,) = _events(tmp_path, "supervisor_restart")
    starts = _events(tmp_path, "run_start")
    assert len(starts) == 2 and handover["ts"] < starts[1]["ts"]
    second = _events(tmp_path, "attempt_start")[-1]
    assert second["attempt"] == 2 and second["resume_step"] > 0
    assert "the project's command changed" in err
    assert_same_weights(tmp_path / "out" / "lora.safetensors", reference)
