"""`trainsup run` over the real sd-scripts train_network.py: a clean run, and a killed trainer.

The user's command is passed unchanged. These runs are the truth the demo trainer imitates: each
assertion here is about what the real trainer printed and wrote, not about the demo.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tomllib
from pathlib import Path
from typing import Any

from safetensors.numpy import load_file

from tests.conftest import trainsup_cmd
from tests.e2e.demo_harness import digest_tree, supervise
from tests.real.bed import Bed, trainer_process, trainsup_pid_of

POLICY = "backoff:\n  initial_s: 0.5\n  max_s: 1\nstop:\n  grace_s: 10\n"
BNB = "Failed to load CPU gemm_4bit_forward from kernels-community: No module named 'kernels'"


def diagnose(log: Path) -> dict[str, Any]:
    done = subprocess.run(trainsup_cmd("diagnose", "--json", str(log)), capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[0])
    return result


def lora_keys(path: Path) -> set[str]:
    return set(load_file(str(path)))


def test_an_uninterrupted_run_with_a_dataset_config_finishes_clean_through_the_bnb_warning(
        bed: Bed, bnb_env: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "out"
    run = supervise(bed.command(out), out, tmp_path, env=bnb_env, policy=POLICY, timeout=900, cwd=bed.sd_scripts)
    log = run.run_dir / "attempt-1.log"
    text = log.read_text(encoding="utf-8", errors="replace")
    assert BNB in text and text.index(BNB) < text.index("steps:")  # printed before training started
    assert run.returncode == 0, run.stderr[-3000:]
    assert not run.of("fault")
    assert run.of("finished")[0]["final_weights"] == str(out / "tiny.safetensors")
    assert any(k.startswith("lora_unet_") for k in lora_keys(out / "tiny.safetensors"))
    # The dataset config ([general], [[datasets]], [[datasets.subsets]]) reached the trainer as a
    # derived copy that reads as the user's file.
    argv = run.of("attempt_start")[0]["argv"]
    derived = Path(argv[argv.index("--dataset_config") + 1])
    assert derived == run.run_dir / "derived" / "attempt-1.dataset.toml"
    user = tomllib.loads((bed.root / "data" / "dataset.toml").read_text())
    assert tomllib.loads(derived.read_text()) == user and user["datasets"][0]["subsets"]
    assert [s["step"] for s in json.loads((run.run_dir / "ledger.json").read_text())["states"]] == [5, 10, 15, 20, 20]
    clean = diagnose(log)
    assert clean["fault"] is None, clean


def test_a_killed_trainer_resumes_from_its_newest_complete_state_and_overwrites_nothing(
        bed: Bed, bnb_env: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "out"
    before_kill: dict[str, str] = {}

    def kill_after_step_10(event: dict[str, Any]) -> None:
        if event["event"] == "state_saved" and event["step"] == 10 and not before_kill:
            pid = trainsup_pid_of(out / ".trainsup")
            trainer = trainer_process(pid) if pid is not None else None
            assert trainer is not None, "no train_network.py process under trainsup"
            before_kill.update(digest_tree(out))
            os.kill(trainer.pid, signal.SIGKILL)

    run = supervise(bed.command(out), out, tmp_path, env=bnb_env, policy=POLICY, on_event=kill_after_step_10,
                    timeout=900, cwd=bed.sd_scripts)
    assert run.returncode == 0, run.stderr[-3000:]
    assert before_kill and "tiny-step00000010-state/random_states_0.pkl" in before_kill
    end = run.of("attempt_end")[0]
    assert end["child_signal"] == 9  # accelerate: `died with <Signals.SIGKILL: 9>`
    assert [f["class"] for f in run.of("fault")] == ["host_oom_killed"]
    start = run.of("attempt_start")[-1]
    newest = out / "tiny-step00000010-state"
    assert (start["resume_from"], start["resume_step"]) == (str(newest), 10)
    argv = start["argv"]
    assert argv[argv.index("--resume") + 1] == str(newest) and "--skip_until_initial_step" in argv
    # Real sd-scripts labels its post-resume saves from its own counter: under the user's name they
    # would land on tiny-step00000005/10 again. Nothing that existed at the kill changed or vanished.
    now = digest_tree(out)
    changed = [rel for rel, digest in before_kill.items() if now.get(rel) != digest]
    assert not changed, changed
    ledger = json.loads((run.run_dir / "ledger.json").read_text())
    # Step 10 is the third batch of epoch 2 (8 batches an epoch). With --skip_until_initial_step real
    # sd-scripts skips to it but counts from 2, the position inside the epoch: its label L is step
    # L + 8. It then finishes epoch 3 (its `global_step >= max_train_steps` break never fires), so it
    # trains to step 24; trainsup says so before it happens.
    resumed = [(Path(s["dir"]).name, s["label"], s["step"]) for s in ledger["states"] if s["attempt"] == 2]
    assert resumed == [("tiny-trainsup2-step00000005-state", 5, 13), ("tiny-trainsup2-step00000010-state", 10, 18),
                       ("tiny-trainsup2-step00000015-state", 15, 23), ("tiny-trainsup2-state", 16, 24)]
    assert [w["extra_steps"] for w in run.of("warning")] == [4]
    finished = run.of("finished")[0]
    assert finished["final_weights"] == str(out / "tiny.safetensors")
    assert lora_keys(out / "tiny.safetensors") == lora_keys(out / "tiny-step00000010.safetensors")
    killed = diagnose(run.run_dir / "attempt-1.log")
    assert killed["fault"] == "host_oom_killed" and "SIGKILL" in killed["evidence"], killed


def test_a_frozen_trainer_is_a_hang_with_its_stacks_and_is_resumed(bed: Bed, tmp_path: Path) -> None:
    # SIGSTOP freezes train_network.py mid-run: no output, no exit, as a deadlock would. With a 5 s
    # floor the hang is found within seconds; py-spy reads the frozen process's stacks all the same.
    out = tmp_path / "out"
    frozen: list[int] = []

    def freeze_after_step_10(event: dict[str, Any]) -> None:
        if event["event"] == "state_saved" and event["step"] == 10 and not frozen:
            pid = trainsup_pid_of(out / ".trainsup")
            trainer = trainer_process(pid) if pid is not None else None
            assert trainer is not None, "no train_network.py process under trainsup"
            os.kill(trainer.pid, signal.SIGSTOP)
            frozen.append(trainer.pid)

    policy = POLICY + "hang:\n  min_timeout_s: 5\n"
    try:
        run = supervise(bed.command(out), out, tmp_path, env=bed.env(), policy=policy,
                        on_event=freeze_after_step_10, timeout=600, cwd=bed.sd_scripts)
    finally:
        for pid in frozen:  # never leave a frozen 4 GB trainer behind, whatever happened
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert run.returncode == 0, run.stderr[-3000:]
    assert frozen and [f["class"] for f in run.of("fault")] == ["hang"]
    evidence = run.of("fault")[0]["evidence"]
    assert "innermost frames: pid" in evidence and "(train_network.py:" in (run.run_dir / "hang-1.txt").read_text()
    start = run.of("attempt_start")[-1]
    assert (start["resume_from"], start["resume_step"]) == (str(out / "tiny-step00000010-state"), 10)
    assert run.of("finished")[0]["final_weights"] == str(out / "tiny.safetensors")
