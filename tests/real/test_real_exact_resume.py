"""An interrupted sd-scripts run ends as if it had never been interrupted (real train_network.py).

Each case runs the bed's command once bare (the reference: what the user gets from an uninterrupted
run) and once under `trainsup run`, where train_network.py is killed -9 at a step picked by a seeded
draw: between two saves, or inside a save. Then the output dir must list exactly the reference's
names, the journal must count exactly the steps asked for, and every weights file must hold the
reference's tensors: equal within float noise, with a data loader with workers (the behaviour suite,
tests/behaviour, kills the bed's own command, without workers, at seeded steps: there the weights
are within the residual docs/guides/resume.md states).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from tests.e2e.demo_harness import supervise, visible_names
from tests.real.bed import Bed, trainer_process, trainsup_pid_of

POLICY = "backoff:\n  initial_s: 0.5\n  max_s: 1\nstop:\n  grace_s: 10\n"
SEED = int(os.environ.get("TRAINSUP_KILL_SEED", "20"))
WORKERS = ("--max_data_loader_n_workers", "2", "--lr_scheduler", "cosine")


def reference(bed: Bed, out: Path, *extra: str) -> Path:
    done = subprocess.run(bed.command(out, *extra), cwd=bed.sd_scripts, env=bed.env(), capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def max_diff(a: Path, b: Path) -> float:
    wa, wb = load_file(str(a)), load_file(str(b))
    assert sorted(wa) == sorted(wb), (a, b)
    return max(float(np.max(np.abs(wa[k].astype(np.float64) - wb[k]))) for k in wa)


def killer(out: Path, when: Callable[[], bool], killed: list[int]) -> threading.Thread:
    """Kill -9 the first attempt's train_network.py as soon as ``when()`` holds."""

    def watch() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not killed:
            if when():
                pid = trainsup_pid_of(out / ".trainsup")
                trainer = trainer_process(pid) if pid is not None else None
                if trainer is not None:
                    trainer.send_signal(signal.SIGKILL)
                    killed.append(trainer.pid)
                    return
            time.sleep(0.005)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def status(out: Path) -> dict:
    try:
        return dict(json.loads((out / ".trainsup" / "status.json").read_text()))
    except (OSError, ValueError):
        return {}


def status_step(out: Path) -> int:
    return int(status(out).get("step") or 0)


def sample_status(out: Path, seen: list[tuple[int, int]], done: threading.Event) -> threading.Thread:
    """What `trainsup status` shows while the run goes on: (attempt, step) every 50 ms."""

    def sample() -> None:
        while not done.is_set():
            now = status(out)
            if now.get("state") == "running" and now.get("step") is not None:
                seen.append((int(now.get("attempt") or 0), int(now["step"])))
            time.sleep(0.05)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    return thread


def assert_true_steps(seen: list[tuple[int, int]], resumed_at: int) -> None:
    """After the resume the status shows the true step (from the resume step on), never the
    trainer's relabelled counter (which restarts at 0), and never past the steps asked for."""
    resumed = [step for attempt, step in seen if attempt >= 2]
    assert resumed and min(resumed) >= resumed_at and max(resumed) <= 20, (resumed_at, resumed)


def assert_as_if_never_interrupted(run_out: Path, ref: Path, events: list[dict], tolerance: float) -> float:
    assert visible_names(run_out) == visible_names(ref)
    ends = [e for e in events if e["event"] == "attempt_end"]
    last_start = [e for e in events if e["event"] == "attempt_start"][-1]
    # Exactly the steps asked for: the last attempt trains from its resume point to step 20, never past.
    assert last_start["resume_step"] + ends[-1]["steps_trained"] == 20, (last_start, ends[-1])
    assert max(e["step"] for e in ends) == 20 and events[-1]["event"] == "finished", events[-1]
    status = json.loads((run_out / ".trainsup" / "status.json").read_text())
    assert (status["state"], status["step"], status["total"]) == ("finished", 20, 20)
    worst = 0.0
    for name in visible_names(ref):
        if name.endswith(".safetensors"):
            worst = max(worst, max_diff(run_out / name, ref / name))
        elif name.endswith("-state"):
            steps = [json.loads((d / name / "train_state.json").read_text())["current_step"] for d in (run_out, ref)]
            assert steps[0] == steps[1], (name, steps)  # the true step, never the resumed label
            worst = max(worst, max_diff(run_out / name / "model.safetensors", ref / name / "model.safetensors"))
    assert worst <= tolerance, f"max |dw| {worst:.3g} over {tolerance:.3g}"
    return worst


@pytest.fixture(scope="module")
def exact_reference(bed: Bed, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return reference(bed, tmp_path_factory.mktemp("reference") / "out", *WORKERS)


@pytest.mark.parametrize("where", ["between saves", "inside a save"])
def test_a_kill_at_a_seeded_step_ends_with_the_uninterrupted_runs_files_and_weights(
        bed: Bed, exact_reference: Path, tmp_path: Path, where: str) -> None:
    out = tmp_path / "out"
    killed: list[int] = []
    draw = random.Random(f"{SEED}-{where}")
    if where == "between saves":
        step = draw.choice([11, 12, 13, 14])  # after the state of step 10, mid-epoch 2 (8 steps an epoch)
        when = lambda: status_step(out) >= step
    else:
        step = draw.choice([10, 15])  # its weights are written, its state is being written
        when = lambda: (out / f"tiny-step{step:08d}.safetensors").exists()
    thread = killer(out, when, killed)
    seen: list[tuple[int, int]] = []
    done = threading.Event()
    sampler = sample_status(out, seen, done)
    run = supervise(bed.command(out, *WORKERS), out, tmp_path, env=bed.env(), policy=POLICY, timeout=600,
                    cwd=bed.sd_scripts)
    done.set()
    thread.join(timeout=1)
    sampler.join(timeout=1)
    assert killed, f"train_network.py was never killed ({where}, step {step}, seed {SEED})"
    assert run.returncode == 0, run.stderr[-3000:]
    assert [e["class"] for e in run.of("fault")] == ["host_oom_killed"]
    # The attempt after the kill; trainsup may relaunch it later from another epoch's end (a segment).
    starts = run.of("attempt_start")
    start = starts[1]
    assert all(s["resume_step"] in (0, 8, 16) for s in starts[1:]), starts  # an epoch's end: exact
    worst = assert_as_if_never_interrupted(out, exact_reference, run.events, 1e-5)
    assert_true_steps(seen, start["resume_step"])
    relaunched = [e["step"] for e in run.of("segment_relaunch")]
    print(f"killed {where} at step {step} (seed {SEED}): resumed at {start['resume_step']}, relaunched at "
          f"{relaunched}, {len([e for e in run.of('state_saved') if e['attempt'] > 1])} states after the kill, "
          f"max |dw| {worst:.3g}")
