"""Hangs over the demo trainer: a silent hang detected, its stacks taken, the run resumed and
finished; slow sampling (longer than the training timeout) never taken for a hang."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.e2e.demo_harness import (
    FAST_POLICY,
    assert_same_weights,
    clean_env,
    demo_argv,
    run_plain,
    supervise,
)

HANG_POLICY = FAST_POLICY + "hang:\n  min_timeout_s: 5\n"


def test_a_silent_hang_is_detected_its_stacks_taken_and_the_run_resumed(assets: dict[str, Path],
                                                                         tmp_path: Path) -> None:
    ref = tmp_path / "reference"
    r = run_plain(demo_argv("train_network", assets, ref))
    assert r.returncode == 0, r.stderr[-2000:]
    out = tmp_path / "out"
    run = supervise(demo_argv("train_network", assets, out), out, tmp_path, policy=HANG_POLICY,
                    env=clean_env(TRAINSUP_DEMO_SIMULATE="hang@7", TRAINSUP_DEMO_STEP_SECONDS="0.1"))
    assert run.returncode == 0, run.stderr[-3000:]
    fault = run.of("fault")[0]
    # the step the bar last showed before step 7 hung (the demo's bar, like tqdm, may skip a redraw)
    assert fault["class"] == "hang" and re.search(r"at step [56] ", fault["evidence"]), fault
    last_progress = max(e["ts"] for e in run.events if e["event"] == "state_saved" and e["step"] == 4)
    assert fault["ts"] - last_progress < 8 + 6 * 0.5  # the timeout (5 s) plus the steps after the state
    stacks = (run.run_dir / "hang-1.txt").read_text()
    assert "hang_forever" in stacks and "hang_forever" in fault["evidence"]  # the demo's blocking frame
    start = run.of("attempt_start")[-1]
    assert start["resume_from"] == str(out / "lora-step00000004-state") and start["resume_step"] == 4
    assert_same_weights(out / "lora.safetensors", ref / "lora.safetensors")


def test_sampling_slower_than_the_training_timeout_is_not_a_hang(assets: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red fox --w 16 --h 16 --s 2\n")
    argv = demo_argv("train_network", assets, out, "--sample_prompts", str(prompts), "--sample_every_n_steps", "5",
                     steps=10)
    run = supervise(argv, out, tmp_path, policy=HANG_POLICY,
                    env=clean_env(TRAINSUP_DEMO_SAMPLE_SECONDS="6", TRAINSUP_DEMO_STEP_SECONDS="0.1"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert not run.of("fault") and len(run.of("attempt_start")) == 1
    assert len(list((out / "sample").glob("*.png"))) == 2
    # no NVIDIA driver on this machine: status.json says so, one info event says why, no sampler ran
    assert json.loads((run.run_dir / "status.json").read_text())["gpu"] is None
    (info,) = run.of("info")
    assert info["message"].startswith("GPU monitoring off: ")
    assert all(e["gpu"] is None for e in run.of("attempt_end"))
