"""`trainsup run` over TRL's real ``trl sft`` (transformers' Trainer on the CPU): a clean run and a
finished run started again, a kill of the training child two steps after the step-10 checkpoint, a
newest checkpoint cut before the resume, a kill of only the ``trl`` parent, and a SIGTERM to trainsup.

The user's command is passed unchanged; every assertion is about what the real trainer printed and
wrote, against an uninterrupted run of the same command without trainsup. A run is ~10-25 s, nearly
all of it two Python start-ups (the ``trl`` parent and its training child).
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import trainsup_cmd
from tests.e2e.demo_harness import digest_tree, supervise, visible_names
from tests.real_hf.bed import HfBed, KillAfter, processes_of, trainer_of

POLICY = "backoff:\n  initial_s: 0.5\n  max_s: 1\nstop:\n  grace_s: 10\n"
STEP_12 = "1.5"  # the epoch the loss dict of step 12 prints (8 steps an epoch)


@pytest.fixture(scope="module")
def reference(hf_bed: HfBed, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The output dir of an uninterrupted run of the bed's command, without trainsup."""
    cwd = tmp_path_factory.mktemp("reference")
    out = cwd / "out"
    done = hf_bed.run_plain(hf_bed.command(out), cwd)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def state(checkpoint: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((checkpoint / "trainer_state.json").read_text())
    return data


def assert_as_uninterrupted(bed: HfBed, out: Path, reference: Path) -> None:
    """The same names as the uninterrupted run, exactly max_steps, and its weights to the bit."""
    assert visible_names(out) == visible_names(reference)
    assert state(out / "checkpoint-20")["global_step"] == 20
    assert bed.max_abs_diff(out / "model.safetensors", reference / "model.safetensors") == 0.0
    assert bed.max_abs_diff(out / "checkpoint-20" / "model.safetensors",
                            reference / "checkpoint-20" / "model.safetensors") == 0.0
    assert not processes_of(out), "a process still names the output dir"


def test_a_clean_run_and_a_finished_run_started_again_train_no_extra_step(
        hf_bed: HfBed, reference: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = hf_bed.command(out)
    run = supervise(argv, out, tmp_path, env=hf_bed.env(), policy=POLICY, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert not run.of("fault") and len(run.of("attempt_start")) == 1
    assert run.of("attempt_start")[0]["argv"] == argv  # the user's command, unchanged
    assert [s["step"] for s in json.loads((run.run_dir / "ledger.json").read_text())["states"]] == [5, 10, 15, 20]
    assert run.of("finished")[0]["final_weights"] == str(out / "model.safetensors")
    assert_as_uninterrupted(hf_bed, out, reference)
    before = digest_tree(out)
    # The same command again: the run is finished; nothing is launched, nothing changes.
    again = subprocess.run(trainsup_cmd("run", "--quiet", "--", *argv), cwd=tmp_path, env=hf_bed.env(),
                           capture_output=True, text=True, timeout=300, check=False)
    assert again.returncode == 0 and "finished" in again.stderr, again.stderr[-2000:]
    # The user's own resume of its last checkpoint (the Trainer would train step 21): refused, nothing launched.
    resumed = subprocess.run(trainsup_cmd("run", "--quiet", "--", *argv, "--resume_from_checkpoint",
                                          str(out / "checkpoint-20")), cwd=tmp_path, env=hf_bed.env(),
                             capture_output=True, text=True, timeout=300, check=False)
    assert resumed.returncode == 2 and "the run is finished" in resumed.stderr, resumed.stderr[-2000:]
    assert "Traceback" not in resumed.stderr
    assert digest_tree(out) == before and not (out / "checkpoint-21").exists()
    assert len(list(run.run_dir.glob("attempt-*.log"))) == 1


def test_trls_bf16_default_on_a_cpu_is_turned_off_and_the_run_trains_as_with_the_flag(
        hf_bed: HfBed, reference: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = hf_bed.command(out, bf16_off=False)
    run = supervise(argv, out, tmp_path, env=hf_bed.env(), policy=POLICY, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    (fault,) = run.of("fault")
    assert fault["class"] == "bf16_unsupported" and "doesn't support bf16/gpu" in fault["evidence"]
    first, second = run.of("attempt_start")
    assert first["argv"] == argv and second["argv"] == [*argv, "--bf16", "false"]
    assert second["resume_from"] is None  # it failed before anything was written
    assert_as_uninterrupted(hf_bed, out, reference)


def test_a_kill_two_steps_after_the_step_10_checkpoint_resumes_to_the_uninterrupted_runs_weights(
        hf_bed: HfBed, reference: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    killer = KillAfter(out / ".trainsup" / "attempt-1.log", out, STEP_12)
    killer.start()
    run = supervise(hf_bed.command(out), out, tmp_path, env=hf_bed.env(), policy=POLICY, timeout=600, cwd=tmp_path)
    killer.join(1)
    assert run.returncode == 0, run.stderr[-3000:]
    assert killer.killed is not None and "checkpoint-10" in killer.complete_at_kill
    assert len(run.of("fault")) == 1 and len(run.of("attempt_start")) == 2
    newest = max(killer.complete_at_kill, key=lambda n: int(n.split("-")[1]))  # 10, or 15 on a slow box
    start = run.of("attempt_start")[1]
    assert (start["resume_from"], start["resume_step"]) == (str(out / newest), int(newest.split("-")[1]))
    argv = start["argv"]
    assert argv[argv.index("--resume_from_checkpoint") + 1] == str(out / newest)
    assert_as_uninterrupted(hf_bed, out, reference)


def test_a_newest_checkpoint_cut_before_the_resume_is_set_aside_and_the_one_before_it_is_used(
        hf_bed: HfBed, reference: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    killer = KillAfter(out / ".trainsup" / "attempt-1.log", out, STEP_12)
    cut: list[Path] = []

    def cut_newest(event: dict[str, Any]) -> None:
        # After the kill, before the relaunch: the newest complete checkpoint loses its last file.
        if event["event"] == "attempt_end" and not cut:
            newest = max(out.glob("checkpoint-*/trainer_state.json"), key=lambda p: int(p.parent.name.split("-")[1]))
            newest.unlink()
            cut.append(newest.parent)

    killer.start()
    run = supervise(hf_bed.command(out), out, tmp_path, env=hf_bed.env(), policy=POLICY, on_event=cut_newest,
                    timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert cut and killer.killed is not None
    step = int(cut[0].name.split("-")[1])
    start = run.of("attempt_start")[1]
    assert start["resume_step"] == step - 5 and start["resume_from"] == str(out / f"checkpoint-{step - 5}")
    aside = [e for e in run.of("state_set_aside") if e["dir"] == str(cut[0])]
    assert len(aside) == 1 and Path(aside[0]["to"]).is_relative_to(run.run_dir / "set-aside")
    assert (Path(aside[0]["to"]) / "model.safetensors").is_file()  # moved, never deleted
    assert_as_uninterrupted(hf_bed, out, reference)


def test_a_kill_of_only_the_trl_parent_leaves_no_orphan_training(
        hf_bed: HfBed, reference: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    killer = KillAfter(out / ".trainsup" / "attempt-1.log", out, STEP_12, parent=True)
    orphans: list[psutil.Process] = []
    alive_at_relaunch: list[bool] = []

    def watch(event: dict[str, Any]) -> None:
        if event["event"] == "attempt_start" and event["attempt"] == 1:
            return
        if event["event"] == "attempt_start" and not alive_at_relaunch:
            alive_at_relaunch.append(any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in orphans))

    def find_child() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not orphans:
            child = trainer_of(out)
            if child is not None:
                orphans.append(child)
            time.sleep(0.01)

    killer.start()
    finder = threading.Thread(target=find_child, daemon=True)
    finder.start()
    run = supervise(hf_bed.command(out), out, tmp_path, env=hf_bed.env(), policy=POLICY, on_event=watch,
                    timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert killer.killed is not None and orphans and alive_at_relaunch == [False]
    assert run.of("attempt_end")[0]["signal"] == signal.SIGKILL
    assert_as_uninterrupted(hf_bed, out, reference)


def test_sigterm_to_trainsup_leaves_nothing_training(hf_bed: HfBed, tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.Popen(trainsup_cmd("run", "--quiet", "--", *hf_bed.command(out)), cwd=tmp_path,
                            env=hf_bed.env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not (out / "checkpoint-5" / "trainer_state.json").exists():
            time.sleep(0.005)
        assert trainer_of(out) is not None
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert not processes_of(out), "a process still names the output dir"
    assert not (out / "checkpoint-20").exists()  # stopped, not finished in the background
