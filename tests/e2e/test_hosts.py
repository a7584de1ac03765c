"""A run dir on shared storage seen by two hosts, played by two real `trainsup run` processes with
different `TRAINSUP_HOST_ID`s over the demo trainer: the second refuses while the first lives (and
while its lease is fresh after a SIGKILL), takes the run over once the lease is stale, and never
signals the pids the other host recorded; a record from this host's earlier boot is treated as
dead, again without a signal. Real processes and signals throughout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from tests.conftest import trainsup_cmd, wait_until
from tests.e2e.demo_harness import alive_pids, clean_env, demo_argv
from trainsup.record.journal import read_events
from trainsup.record.lease import read_lease

STALE_S = 6  # lease.stale_s for these tests: renewed every 1.5 s


def _project(tmp_path: Path, assets: dict[str, Path]) -> None:
    projects = tmp_path / "projects"
    projects.mkdir(exist_ok=True)
    # hang@5: silent from step 5 on, so the orphan never meets its closed pipe and lives on
    env = {"TRAINSUP_DEMO_SIMULATE": "hang@5", "TRAINSUP_DEMO_STEP_SECONDS": "0.1"}
    command = demo_argv("train_network", assets, tmp_path / "out")
    (projects / "demo.yaml").write_text(
        f"command: {json.dumps(command)}\nenv: {json.dumps(env)}\nrun_dir: {tmp_path / 'run'}\n"
        f"stop:\n  grace_s: 5\nhang:\n  min_timeout_s: 600\nlease:\n  stale_s: {STALE_S}\n")


def _start(tmp_path: Path, host: str) -> subprocess.Popen[str]:
    env = clean_env(TRAINSUP_PROJECTS=str(tmp_path / "projects"), TRAINSUP_HOST_ID=host)
    return subprocess.Popen(trainsup_cmd("run", "--quiet", "--project", "demo"), cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _events(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    try:
        return [e for e in read_events(run_dir) if e["event"] == kind]
    except (OSError, ValueError):
        return []


def _kill(pids: list[int]) -> None:
    for pid in alive_pids(pids):
        os.kill(pid, signal.SIGKILL)


def test_a_second_host_refuses_a_live_owner_then_takes_a_stale_lease_over_without_signalling_its_pids(
        assets: dict[str, Path], tmp_path: Path) -> None:
    _project(tmp_path, assets)
    run_dir = tmp_path / "run"
    first = _start(tmp_path, "host-a")
    trainer: list[int] = []
    third: subprocess.Popen[str] | None = None
    try:
        wait_until(lambda: _events(run_dir, "state_saved"), 120, what="host-a's trainer at step 4")
        time.sleep(1.5)  # into the silent hang
        trainer = [p.pid for p in psutil.Process(first.pid).children(recursive=True)]
        recorded = json.loads((run_dir / "trainer.json").read_text())
        assert recorded["host"] == "host-a" and recorded["boot_id"]

        second = _start(tmp_path, "host-b")
        _, err = second.communicate(timeout=30)
        assert second.returncode == 2
        assert err.startswith(f"trainsup: error: {run_dir} is owned by a live trainsup on host host-a "
                              f"(pid {first.pid}, lease renewed ")
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
        assert first.poll() is None and alive_pids(trainer) == trainer

        first.send_signal(signal.SIGKILL)  # host-a's supervisor dies; its silent trainer lives on
        first.communicate(timeout=30)
        lease = read_lease(run_dir)
        assert lease is not None and lease.host == "host-a"
        if lease.age(time.time()) < STALE_S - 3:  # still fresh: another host cannot tell it from a live one
            again = _start(tmp_path, "host-b")
            _, err = again.communicate(timeout=30)
            assert again.returncode == 2 and "owned by a live trainsup on host host-a" in err

        wait_until(lambda: lease.age(time.time()) > STALE_S + 0.2, STALE_S + 5, what="the lease to go stale")
        third = _start(tmp_path, "host-b")
        wait_until(lambda: len(_events(run_dir, "attempt_start")) >= 2, 60, what="host-b's own launch")
        (taken,) = _events(run_dir, "lease_taken_over")
        assert taken["host"] == "host-a" and taken["pid"] == first.pid and taken["age_s"] > STALE_S
        (left,) = _events(run_dir, "orphan_not_signalled")
        assert left["host"] == "host-a" and left["why"] == "other_host" and set(trainer) <= set(left["pids"])
        assert not _events(run_dir, "orphan_stopped")
        assert alive_pids(trainer) == trainer  # host-a's pids were never signalled
        (lost,) = [e for e in _events(run_dir, "attempt_end") if e.get("supervisor_lost")]
        assert lost["attempt"] == 1
        now = read_lease(run_dir)
        assert now is not None and now.host == "host-b" and now.pid == third.pid
        third.send_signal(signal.SIGTERM)
        _, err = third.communicate(timeout=60)
        assert third.returncode == 143, err[-2000:]
        assert "recorded on host host-a" in err and read_lease(run_dir) is None  # released at its end
        assert alive_pids(trainer) == trainer
    finally:
        for proc in (first, third):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.communicate()
        _kill(trainer)  # the orphan is this test's to clean up: no supervisor here may signal it


def test_a_record_from_this_hosts_earlier_boot_is_dead_and_never_signalled(assets: dict[str, Path],
                                                                            tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # A demo trainer that carries the recorded pid here and now, as a reused pid would after a reboot.
    orphan = subprocess.Popen(demo_argv("train_network", assets, tmp_path / "old-out"), start_new_session=True,
                              env=clean_env(TRAINSUP_DEMO_SIMULATE="hang@1"), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        started = psutil.Process(orphan.pid).create_time()
        (run_dir / "trainer.json").write_text(json.dumps({
            "supervisor_pid": 1, "host": "host-c", "boot_id": "00000000-0000-4000-8000-0000000000ea",
            "attempt": 1, "pgid": orphan.pid, "procs": [{"pid": orphan.pid, "started": started}]}))
        (run_dir / "events.jsonl").write_text(json.dumps({"ts": time.time() - 600, "event": "attempt_start",
                                                          "attempt": 1}) + "\n")
        done = subprocess.run(trainsup_cmd("run", "--quiet", "--run-dir", str(run_dir), "--",
                                           sys.executable, "-c", "print('resumed')"),
                              env=clean_env(TRAINSUP_HOST_ID="host-c"), capture_output=True, text=True,
                              timeout=60, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "before this host rebooted" in done.stderr
        (left,) = _events(run_dir, "orphan_not_signalled")
        assert left["why"] == "earlier_boot" and left["pids"] == [orphan.pid]
        assert not _events(run_dir, "orphan_stopped")
        assert [e for e in _events(run_dir, "attempt_end") if e.get("supervisor_lost")]
        assert orphan.poll() is None  # untouched
    finally:
        orphan.kill()
        orphan.wait()


def test_a_supervisor_whose_lease_another_host_took_over_stops_its_trainer(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    policy = tmp_path / "policy.yaml"
    policy.write_text("lease:\n  stale_s: 2\nstop:\n  grace_s: 2\n")  # renewed every 0.5 s
    sup = subprocess.Popen(trainsup_cmd("run", "--quiet", "--policy", str(policy), "--run-dir", str(run_dir), "--",
                                        sys.executable, "-c", "import time; print('training', flush=True); "
                                        "time.sleep(60)"),
                           env=clean_env(TRAINSUP_HOST_ID="host-a"), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: (run_dir / "trainer.json").exists(), 30, what="the trainer")
        trainer = [p.pid for p in psutil.Process(sup.pid).children(recursive=True)]
        # host-b judged host-a dead (it was suspended, or cut off from the storage) and took the run over
        (run_dir / "lease.json").write_text(json.dumps({"host": "host-b", "boot_id": "b", "pid": 7,
                                                        "renewed": time.time(), "stale_s": 2}))
        _, err = sup.communicate(timeout=30)
        assert sup.returncode == 143, err[-2000:]
        assert "the run was taken over by host host-b (pid 7" in err
        assert not alive_pids(trainer)  # its own trainer: stopped, never two on one output dir
        assert json.loads((run_dir / "lease.json").read_text())["host"] == "host-b"  # not removed: not its own
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.communicate()
