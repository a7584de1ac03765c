"""`trainsup run` against small real children: signals, floods, garbage, restart budget, policy errors."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from tests.conftest import CHILDREN, ROOT, run_trainsup, trainsup_cmd, wait_until

CHILD = str(CHILDREN / "train_network.py")


def events(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]


def policy(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return path


def test_sigterm_stops_the_whole_tree_and_exits_143(tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    pol = policy(tmp_path, "stop:\n  grace_s: 1\n")
    proc = subprocess.Popen(trainsup_cmd("run", "--quiet", "--policy", str(pol), "--", sys.executable, CHILD,
                                         "hang", str(pidfile), "--output_dir", str(tmp_path / "out")),
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: pidfile.exists() and pidfile.read_text().endswith("\n"), what="child pids")
        pids = [int(x) for x in pidfile.read_text().split()]
        tree = [psutil.Process(p) for p in pids]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 143
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    for p in tree:  # both ignore SIGTERM: only the group SIGKILL after the grace period ends them
        assert not p.is_running() or p.status() == psutil.STATUS_ZOMBIE, f"{p.pid} survived"
    run_dir = tmp_path / "out" / ".trainsup"
    ends = [e for e in events(run_dir) if e["event"] == "gave_up"]
    assert ends and ends[-1]["exit_code"] == 143


def _peak_rss_while(proc: subprocess.Popen[bytes]) -> int:
    peak = 0
    ps = psutil.Process(proc.pid)
    while proc.poll() is None:
        try:
            peak = max(peak, ps.memory_info().rss)
        except psutil.Error:
            break
        time.sleep(0.01)
    return peak


def test_50mb_line_without_newline_and_binary_garbage_are_survived(tmp_path: Path) -> None:
    for mode in ("longline", "binary"):
        out = tmp_path / mode
        proc = subprocess.Popen(trainsup_cmd("run", "--quiet", "--", sys.executable, CHILD, mode, "50",
                                             "--output_dir", str(out)),
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        err: list[bytes] = []
        reader = threading.Thread(target=lambda p=proc, e=err: e.append(p.stderr.read()))  # type: ignore[union-attr]
        reader.start()
        peak = _peak_rss_while(proc)
        reader.join()
        assert proc.wait() == 0, err[0].decode(errors="replace")[-2000:]
        log = out / ".trainsup" / "attempt-1.log"
        assert log.stat().st_size >= 50 * (1 << 20), "the log must keep every byte"
        # Bounded memory: a naive reader would hold the 50 MB line (twice, decoded).
        assert peak < 120 * (1 << 20), f"{mode}: peak RSS {peak / 2**20:.0f} MiB"
        assert [e["event"] for e in events(out / ".trainsup")][-1] == "finished"


def test_restart_budget_exhausted_gives_up_with_exit_3(tmp_path: Path) -> None:
    pol = policy(tmp_path, "restart:\n  max: 2\n  min_uptime_s: 0\nbackoff:\n  initial_s: 0.05\n")
    r = run_trainsup(["run", "--quiet", "--policy", str(pol), "--", sys.executable, CHILD, "fail",
                      "something odd", "--output_dir", str(tmp_path / "out")], cwd=ROOT)
    assert r.returncode == 3, r.stderr
    ev = events(tmp_path / "out" / ".trainsup")
    assert [e["attempt"] for e in ev if e["event"] == "attempt_start"] == [1, 2, 3]
    assert {e["class"] for e in ev if e["event"] == "fault"} == {"unknown"}
    assert "restart budget exhausted" in ev[-1]["reason"]


def test_exited_too_quickly_gives_up(tmp_path: Path) -> None:
    pol = policy(tmp_path, "restart:\n  min_uptime_s: 30\n  max_quick_exits: 2\nbackoff:\n  initial_s: 0\n")
    r = run_trainsup(["run", "--quiet", "--policy", str(pol), "--", sys.executable, CHILD, "crash", "x",
                      "--output_dir", str(tmp_path / "out")], cwd=ROOT)
    assert r.returncode == 3, r.stderr
    assert "exited too quickly 2 times" in events(tmp_path / "out" / ".trainsup")[-1]["reason"]


def test_bad_policy_is_a_usage_error_naming_file_and_line(tmp_path: Path) -> None:
    pol = policy(tmp_path, "restart:\n  max: five\n")
    r = run_trainsup(["run", "--policy", str(pol), "--", sys.executable, CHILD, "ok"], cwd=ROOT)
    assert r.returncode == 2
    assert f"{pol}:2: restart.max: expected an integer >= 0, got 'five'" in r.stderr
    pol.write_text("restart: [\n")
    r = run_trainsup(["run", "--policy", str(pol), "--", sys.executable, CHILD, "ok"], cwd=ROOT)
    assert r.returncode == 2 and "malformed YAML" in r.stderr
    r = run_trainsup(["run", "--policy", str(tmp_path / "missing.yaml"), "--", sys.executable, CHILD, "ok"],
                     cwd=ROOT)
    assert r.returncode == 2 and "missing.yaml" in r.stderr


def test_missing_program_stops_with_exit_4(tmp_path: Path) -> None:
    r = run_trainsup(["run", "--quiet", "--", str(tmp_path / "nope.py"), "--output_dir", str(tmp_path)],
                     cwd=ROOT)
    assert r.returncode == 4, r.stderr
    assert "no such program" in r.stderr


def test_a_full_disk_for_the_run_dir_stops_cleanly_and_touches_nothing_of_the_users(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a cat\n")
    run_dir = tmp_path / "run"
    (run_dir / "prompts").mkdir(parents=True)
    # Writes to /dev/full fail with ENOSPC, exactly like a full disk.
    (run_dir / "prompts" / "attempt-1.txt").symlink_to("/dev/full")
    r = run_trainsup(["run", "--quiet", "--run-dir", str(run_dir), "--", sys.executable, CHILD, "ok",
                      "--output_dir", str(tmp_path / "out"), "--sample_prompts", str(prompts)], cwd=ROOT)
    assert r.returncode == 4, r.stderr
    assert "disk_full: cannot write this launch's files" in r.stderr and "No space left on device" in r.stderr
    assert "Traceback" not in r.stderr
    assert prompts.read_text() == "a cat\n"
    assert [e["event"] for e in events(run_dir)][-1] == "gave_up"


def test_a_warning_naming_a_missing_module_neither_fails_a_finished_run_nor_explains_a_kill(tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = run_trainsup(["run", "--quiet", "--", sys.executable, CHILD, "warned", "ok", "--output_dir", str(out)],
                     cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert not [e for e in events(out / ".trainsup") if e["event"] == "fault"]
    pol = policy(tmp_path, "restart:\n  max: 1\n  min_uptime_s: 0\nbackoff:\n  initial_s: 0.05\n")
    killed = tmp_path / "killed"
    r = run_trainsup(["run", "--quiet", "--policy", str(pol), "--", sys.executable, CHILD, "warned", "killed",
                      "--output_dir", str(killed)], cwd=ROOT)
    assert r.returncode == 3, r.stderr  # restarted (a kill is not a missing dependency), then out of budget
    faults = [e for e in events(killed / ".trainsup") if e["event"] == "fault"]
    assert [(f["class"], f["evidence"]) for f in faults] == [("host_oom_killed", None)] * 2
