"""Process faults around the demo trainer: a SIGKILL mid-run with a half-written newer state,
a config error that must not loop, and a NaN loss stopped live."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import psutil

from tests.e2e.demo_harness import (
    assert_same_weights,
    assert_untouched,
    clean_env,
    demo_argv,
    run_plain,
    supervise,
    visible_names,
)


def trainer_processes(out: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        # the trainer itself (`python -m trainsup.demo.X ...`), not trainsup (whose argv holds it too)
        if cmd[1:3] and cmd[1] == "-m" and cmd[2].startswith("trainsup.demo.") and cmd[2] != "trainsup.demo.launch" \
                and str(out) in cmd:
            found.append(proc)
    return found


def test_sigkill_mid_run_resumes_from_the_newest_complete_state_and_skips_a_half_written_one(
        assets: dict[str, Path], tmp_path: Path) -> None:
    ref = tmp_path / "reference"
    r = run_plain(demo_argv("train_network", assets, ref))
    assert r.returncode == 0, r.stderr[-2000:]
    out = tmp_path / "out"
    partial = out / "lora-step00000012-state"
    killed: list[int] = []

    def kill_after_step_8(event: dict) -> None:
        if event["event"] == "state_saved" and event["step"] == 8 and not killed:
            # What a kill in the middle of the next save leaves: the first files of a newer state.
            partial.mkdir()
            (partial / "train_state.json").write_text(json.dumps({"current_epoch": 3, "current_step": 12}))
            (partial / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":")
            for proc in trainer_processes(out):
                proc.send_signal(signal.SIGKILL)
                killed.append(proc.pid)

    run = supervise(demo_argv("train_network", assets, out), out, tmp_path,
                    env=clean_env(TRAINSUP_DEMO_STEP_SECONDS="0.15"), on_event=kill_after_step_8)
    assert run.returncode == 0, run.stderr[-3000:]
    assert killed
    assert run.of("attempt_end")[0]["signal"] == signal.SIGKILL
    assert [f["class"] for f in run.of("fault")] == ["host_oom_killed"]
    start = run.of("attempt_start")[-1]
    assert start["resume_from"] == str(out / "lora-step00000008-state") and start["resume_step"] == 8
    # Never resumed from, never deleted: moved aside whole, and a complete save of step 12 in its place.
    aside = [e for e in run.of("state_set_aside") if e["dir"] == str(partial)]
    assert aside and (Path(aside[0]["to"]) / "train_state.json").exists()
    assert json.loads((partial / "train_state.json").read_text())["current_step"] == 12
    assert_same_weights(out / "lora.safetensors", ref / "lora.safetensors")
    assert_same_weights(out / "lora-step00000016.safetensors", ref / "lora-step00000016.safetensors")
    assert visible_names(out) == visible_names(ref)  # as if the run had never been interrupted
    assert_untouched(run, out)
    # The ledger knows the true step of every state, whatever the trainer labelled it; the resumed
    # attempt's own saves are kept out of sight in the run dir, only the newest two epoch ends (4
    # steps an epoch here) and the newest of all: the rest are pruned (the published ones stay).
    ledger = json.loads((run.run_dir / "ledger.json").read_text())
    steps = {Path(s["dir"]).name: s["step"] for s in ledger["states"]}
    assert steps["lora-step00000008-state"] == 8
    resumed = [s for s in ledger["states"] if s["attempt"] == 2 and "-step" in s["dir"]]
    assert sorted(s["step"] for s in resumed) == [16, 20]
    assert all(Path(s["dir"]).parent == run.run_dir / "saves" for s in resumed)
    assert 12 in [e["step"] for e in run.of("save_pruned")] and (out / "lora-step00000012-state").is_dir()
    # Exactly the remaining steps after the resume, and the status snapshot agrees.
    assert run.of("attempt_end")[-1]["steps_trained"] == 12
    status = json.loads((run.run_dir / "status.json").read_text())
    assert (status["state"], status["step"], status["total"]) == ("finished", 20, 20)


def test_a_kill_after_the_last_state_resumes_one_state_earlier(assets: dict[str, Path], tmp_path: Path) -> None:
    """The state at --max_train_steps is complete, the final save is under way: kohya refuses to
    resume at its last step (--initial_step must stay below --max_train_steps), so the run goes on
    from the state before it and trains those steps again (found by the chaos soak)."""
    ref = tmp_path / "reference"
    assert run_plain(demo_argv("train_network", assets, ref)).returncode == 0
    out = tmp_path / "out"
    killed: list[int] = []

    def kill_in_the_final_save(event: dict) -> None:
        if event["event"] == "state_saved" and event["step"] == 20 and not killed:
            for proc in trainer_processes(out):
                proc.send_signal(signal.SIGKILL)
                killed.append(proc.pid)

    run = supervise(demo_argv("train_network", assets, out), out, tmp_path, on_event=kill_in_the_final_save,
                    env=clean_env(TRAINSUP_DEMO_STEP_SECONDS="0.05", TRAINSUP_DEMO_SAVE_SECONDS="1"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert killed
    start = run.of("attempt_start")[-1]
    assert start["attempt"] == 2 and start["resume_from"] == str(out / "lora-step00000016-state")
    assert [f["class"] for f in run.of("fault")] == ["host_oom_killed"]
    assert_same_weights(out / "lora.safetensors", ref / "lora.safetensors")
    assert visible_names(out) == visible_names(ref)


def test_real_child_status_behind_an_accelerate_style_launcher(assets: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = demo_argv("train_network", assets, out)
    launched = [argv[0], "-m", "trainsup.demo.launch", "-m", *argv[2:]]
    killed: list[int] = []

    def kill_trainer(event: dict) -> None:
        if event["event"] == "state_saved" and not killed:
            for proc in trainer_processes(out):
                proc.send_signal(signal.SIGKILL)
                killed.append(proc.pid)

    run = supervise(launched, out, tmp_path, env=clean_env(TRAINSUP_DEMO_STEP_SECONDS="0.15"),
                    on_event=kill_trainer)
    assert run.returncode == 0, run.stderr[-3000:]
    end = run.of("attempt_end")[0]
    # The launcher itself exits 1; its CalledProcessError text tells the trainer died of SIGKILL.
    assert (end["exit_code"], end["child_signal"]) == (1, signal.SIGKILL)
    assert [f["class"] for f in run.of("fault")] == ["host_oom_killed"]
    assert run.of("attempt_start")[-1]["resume_step"] == 4


def test_exit_0_without_training_is_not_success(assets: dict[str, Path], tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tmp_path / "out"
    argv = demo_argv("train_network", assets, out)
    argv[argv.index("--train_data_dir") + 1] = str(empty)
    run = supervise(argv, out, tmp_path)
    assert run.of("attempt_end")[0]["exit_code"] == 0
    assert run.returncode == 4 and [f["class"] for f in run.of("fault")] == ["config_error"]


def test_config_error_stops_at_once_with_exit_4(assets: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    run = supervise(demo_argv("train_network", assets, out, "--lowvram"), out, tmp_path)
    assert run.returncode == 4, run.stderr[-2000:]
    assert len(run.of("attempt_start")) == 1
    assert [f["class"] for f in run.of("fault")] == ["config_error"]
    assert "unrecognized arguments: --lowvram" in run.of("fault")[0]["evidence"]
    assert run.events[-1]["event"] == "gave_up" and run.events[-1]["exit_code"] == 4


def test_nan_loss_is_stopped_live_and_stops_the_run_when_it_recurs(assets: dict[str, Path],
                                                                  tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = demo_argv("train_network", assets, out, "--learning_rate", "1e8", steps=200, save_every=100)
    run = supervise(argv, out, tmp_path, env=clean_env(TRAINSUP_DEMO_STEP_SECONDS="0.05"))
    assert run.returncode == 4, run.stderr[-2000:]
    assert [f["class"] for f in run.of("fault")] == ["nan_loss", "nan_loss"]
    for end in run.of("attempt_end"):
        assert end["steps_trained"] < 100  # stopped as soon as the bar showed NaN, long before the end
    assert "lower --learning_rate" in run.events[-1]["reason"]
