"""A trainer of its own shape under trainsup, both ways: as any command (no trainer knowledge: killed,
restarted unchanged) and with a project file's declarative ``trainer:`` section (killed, resumed from
its own newest complete state; a state cut mid-save set aside, never resumed from)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import psutil

from tests.conftest import ROOT, trainsup_cmd, wait_until
from tests.e2e.demo_harness import clean_env, digest_tree
from trainsup.demo.story import follow
from trainsup.record.journal import read_events

CHILD = str(ROOT / "tests" / "children" / "own_shape_trainer.py")
FAST = "backoff:\n  initial_s: 0.2\n  max_s: 0.5\nstop:\n  grace_s: 5\n"


def own_argv(out: Path) -> list[str]:
    return [sys.executable, CHILD, "--out", str(out), "--steps", "20", "--every", "5"]


def reference_weight(tmp: Path) -> float:
    out = tmp / "reference"
    subprocess.run([*own_argv(out), "--step-seconds", "0"], check=True, capture_output=True, timeout=60)
    return float(json.loads((out / "final.json").read_text())["weight"])


def trainer_pids() -> list[int]:
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            argv = p.cmdline()
            if len(argv) > 1 and argv[1] == CHILD:  # the trainer itself, not trainsup naming it
                found.append(p.pid)
        except psutil.Error:
            continue
    return found


def run(args: list[str], run_dir: Path, env: dict[str, str] | None = None, on_event: Any = None,
        timeout: float = 120) -> tuple[int, list[dict[str, Any]], str]:
    proc = subprocess.Popen(trainsup_cmd("run", "--quiet", *args), cwd=ROOT, env=env or clean_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read() if proc.stderr else ""))
    reader.start()
    try:
        follow(proc, run_dir, on_event or (lambda _e: None), timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        reader.join()
    return proc.returncode, read_events(run_dir), "".join(err)


def test_any_command_is_restarted_unchanged_after_a_kill_and_rungs_without_meaning_are_journaled(
        tmp_path: Path) -> None:
    out = tmp_path / "out"
    policy = tmp_path / "policy.yaml"
    policy.write_text(FAST)
    killed: list[int] = []

    def kill_after_ckpt_10() -> None:
        wait_until(lambda: (out / "ckpt-10" / "done.marker").exists(), timeout=60, what="ckpt-10")
        pids = trainer_pids()
        os.kill(pids[0], signal.SIGKILL)
        killed.extend(pids)

    killer = threading.Thread(target=kill_after_ckpt_10)
    killer.start()
    code, events, err = run(["--policy", str(policy), "--", *own_argv(out)], out / ".trainsup")
    killer.join()
    assert code == 0, err
    assert killed
    assert [e["trainer"] for e in events if e["event"] == "run_start"] == ["command"]
    starts = [e for e in events if e["event"] == "attempt_start"]
    assert len(starts) == 2 and starts[0]["argv"] == starts[1]["argv"] == own_argv(out)  # unchanged
    assert all(s["resume_from"] is None for s in starts)
    # The kill reads as host_oom_killed. The kernel's OOM killer killed nothing meanwhile, so the
    # command is restarted as it was; had it (an OOM elsewhere on the host), the neutral ladder's first
    # rung (fewer DataLoader workers) would mean nothing for a command trainsup does not know: skipped,
    # and said so, then its restart. Either way the argv stays the user's (above).
    assert [f["class"] for f in events if f["event"] == "fault"] == ["host_oom_killed"]
    skipped = [e for e in events if e["event"] == "remedy_skipped"]
    not_for_memory = [e for e in events if e["event"] == "info" and "OOM killer killed nothing" in e["message"]]
    if not_for_memory:
        assert not skipped
    else:
        assert [s["rung"] for s in skipped] == [0] and all(s["trainer"] == "command" for s in skipped)
    assert events[-1]["event"] == "finished"
    assert json.loads((out / "final.json").read_text())["weight"] == reference_weight(tmp_path)


def project(tmp_path: Path, out: Path, env: dict[str, str] | None = None) -> Path:
    path = tmp_path / "own.yaml"
    path.write_text(json.dumps({
        "command": own_argv(out), "env": env or {},
        "trainer": {"states": str(out / "ckpt-*"), "complete": "done.marker", "step": r"ckpt-(\d+)$",
                    "resume": ["--from", "{state}"], "progress": r"\[step (?P<step>\d+)/(?P<total>\d+)\] "
                    r"loss=(?P<loss>\S+)", "success": "^all done$"},
        "backoff": {"initial_s": 0.2, "max_s": 0.5}, "stop": {"grace_s": 5}}))  # JSON is YAML
    return path


def test_a_declared_trainer_is_resumed_from_its_newest_complete_state_and_ends_as_if_never_killed(
        tmp_path: Path) -> None:
    out = tmp_path / "out"
    before: dict[str, str] = {}

    def kill_after_state_10(event: dict[str, Any]) -> None:
        if event["event"] == "state_saved" and event["step"] == 10 and not before:
            before.update(digest_tree(out))
            for pid in trainer_pids():
                os.kill(pid, signal.SIGKILL)

    code, events, err = run(["--project", str(project(tmp_path, out))], out / ".trainsup",
                            on_event=kill_after_state_10)
    assert code == 0, err
    assert [e["trainer"] for e in events if e["event"] == "run_start"] == ["declarative"]
    start = [e for e in events if e["event"] == "attempt_start"][-1]
    assert (start["resume_from"], start["resume_step"]) == (str(out / "ckpt-10"), 10)
    assert start["argv"][-2:] == ["--from", str(out / "ckpt-10")]
    assert [e["step"] for e in events if e["event"] == "state_saved"] == [5, 10, 15, 20]
    status = json.loads((out / ".trainsup" / "status.json").read_text())
    assert (status["state"], status["step"], status["total"]) == ("finished", 20, 20)
    assert json.loads((out / "final.json").read_text())["weight"] == reference_weight(tmp_path)
    now = digest_tree(out)
    assert before and all(now.get(rel) == digest for rel, digest in before.items())


def test_a_declared_state_cut_mid_save_is_set_aside_and_never_resumed_from(tmp_path: Path) -> None:
    out = tmp_path / "out"
    code, events, err = run(["--project", str(project(tmp_path, out, {"OWN_SHAPE_DIE_IN_SAVE": "15"}))],
                            out / ".trainsup")
    assert code == 0, err
    start = [e for e in events if e["event"] == "attempt_start"][-1]
    assert start["resume_from"] == str(out / "ckpt-10")  # ckpt-15 has no done.marker
    aside = [e for e in events if e["event"] == "state_set_aside"]
    assert [(Path(e["dir"]).name, e["step"]) for e in aside] == [("ckpt-15", 15)]
    kept = out / ".trainsup" / "set-aside" / "attempt-2" / "ckpt-15" / "weight.json"
    assert kept.is_file()  # moved, never deleted
    assert json.loads((out / "final.json").read_text())["weight"] == reference_weight(tmp_path)


def test_a_weights_file_a_killed_attempt_left_half_written_is_moved_into_the_run_dir(tmp_path: Path) -> None:
    """Killed inside its final write (a safetensors-like ``.tmpXXXXXX``, then a rename), the trainer
    leaves the temporary file; the run still ends with the files of an uninterrupted one, the
    half-written file kept in the run dir; a user's file of that name from before the run stays."""
    out = tmp_path / "out"
    out.mkdir()
    users = out / ".tmpUser01"
    users.write_text("the user's own")
    os.utime(users, (1_600_000_000, 1_600_000_000))
    code, events, err = run(["--project", str(project(tmp_path, out, {"OWN_SHAPE_KILLED_IN_FINAL": "1"}))],
                            out / ".trainsup")
    assert code == 0, err
    assert len([e for e in events if e["event"] == "attempt_start"]) == 2
    assert sorted(p.name for p in out.glob(".tmp*")) == [".tmpUser01"]
    assert users.read_text() == "the user's own"
    aside = [e for e in events if e["event"] == "state_set_aside"]
    assert len(aside) == 1 and "write cut short" in aside[0]["why"], aside
    left = Path(aside[0]["dir"])
    assert left.parent == out and left.name.startswith(".tmp") and not left.exists()
    kept = out / ".trainsup" / "set-aside" / "attempt-2" / left.name
    assert Path(aside[0]["to"]) == kept and kept.read_text().startswith('{"step": 20')  # moved, never deleted
    assert json.loads((out / "final.json").read_text())["weight"] == reference_weight(tmp_path)


def test_a_bad_trainer_section_is_a_usage_error_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(json.dumps({"command": own_argv(tmp_path / "out"),
                                "trainer": {"states": "out/ckpt-*", "resume": ["--from"]}}))
    done = subprocess.run(trainsup_cmd("run", "--project", str(path)), capture_output=True, text=True,
                          timeout=60, cwd=ROOT, check=False)
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1 and "trainer.resume" in errors[0] and "{state}" in errors[0], done.stderr


def test_a_command_no_adapter_knows_is_a_hang_when_it_falls_silent_and_not_while_it_prints(tmp_path: Path) -> None:
    # Prints a line every 0.5 s for 3 s (longer than the 2 s timeout: alive, not hung), then nothing.
    child = ("import sys, time\n"
             "for i in range(6):\n    print('working', i, flush=True); time.sleep(0.5)\n"
             "time.sleep(120)\n")
    out = tmp_path / "out"
    policy = tmp_path / "policy.yaml"
    policy.write_text(FAST + "restart:\n  max: 1\nhang:\n  timeout_s: 2\n")
    code, events, err = run(["--policy", str(policy), "--", sys.executable, "-c", child, "--out", str(out)],
                            out / ".trainsup", timeout=120)
    faults = [e for e in events if e["event"] == "fault"]
    assert faults and all(f["class"] == "hang" for f in faults), err
    ends = [e for e in events if e["event"] == "attempt_end"]
    assert ends[0]["uptime_s"] >= 4.5  # the printing phase (3 s) + the silence (2 s): never cut short
    assert code in (3, 4) and events[-1]["event"] == "gave_up", err
