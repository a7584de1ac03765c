"""`trainsup status`, `logs` and `stop` against real `trainsup run` processes over the demo trainer:
a running run named by its project, a stopped one, a finished one after a restart, a lost one (its
supervisor SIGKILLed), a corrupt status.json; plus the pure formatting helpers."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from tests.conftest import ROOT, trainsup_cmd, wait_until
from tests.e2e.demo_harness import FAST_POLICY, clean_env, cli, demo_argv, status_of
from trainsup.commands.status import RunView, format_line, run_status
from trainsup.record.textfmt import eta_seconds, format_duration


class Run:
    """A `trainsup run` of the demo trainer in the background, its output in files."""

    def __init__(self, tmp: Path, assets: dict[str, Path], env: dict[str, str], steps: int = 40) -> None:
        self.out, self.run_dir = tmp / "out", tmp / "out" / ".trainsup"  # the default run dir
        self.argv = demo_argv("train_network", assets, self.out, steps=steps)
        policy = tmp / "policy.yaml"
        policy.write_text(FAST_POLICY)
        with open(tmp / "run.stdout", "wb") as so, open(tmp / "run.stderr", "wb") as se:
            self.proc = subprocess.Popen(trainsup_cmd("run", "--quiet", "--policy", str(policy), "--", *self.argv),
                                         cwd=ROOT, env=env, stdout=so, stderr=se)

    def status(self) -> dict[str, Any]:
        try:
            return dict(json.loads((self.run_dir / "status.json").read_text()))
        except (OSError, ValueError):
            return {}

    def wait_for_step(self, step: int) -> None:
        wait_until(lambda: self.status().get("state") == "running" and self.status().get("step", 0) >= step,
                   timeout=40, what=f"step {step} in status.json")

    def trainers(self) -> list[psutil.Process]:
        return psutil.Process(self.proc.pid).children(recursive=True)

    def end(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)


def one_error_line(stderr: str, *naming: str) -> None:
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1 and errors[0].startswith("trainsup"), stderr
    for word in naming:
        assert word in errors[0], errors[0]


def gone(procs: list[psutil.Process]) -> bool:
    for p in procs:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            pass
    return True


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "projects").mkdir()
    return clean_env(TRAINSUP_DEMO_STEP_SECONDS="0.2", TRAINSUP_PROJECTS=str(tmp_path / "projects"))


def test_a_running_project_shown_followed_and_stopped(assets: dict[str, Path], tmp_path: Path,
                                                      env: dict[str, str]) -> None:
    run = Run(tmp_path, assets, env)
    projects = tmp_path / "projects"
    (projects / "alpha.yaml").write_text(yaml.safe_dump({"command": run.argv, "run_dir": str(run.run_dir)}))
    (projects / "fresh.yaml").write_text(yaml.safe_dump({"command": run.argv, "run_dir": str(tmp_path / "no")}))
    follower = None
    try:
        run.wait_for_step(3)
        entry = status_of("alpha", env)
        assert entry["name"] == "alpha" and entry["state"] == "running" and entry["pid"] == run.proc.pid
        assert entry["attempt"] == 1 and 3 <= entry["step"] < 40 and entry["total"] == 40
        assert entry["run_dir"] == str(run.run_dir) and entry["last_fault"] is None
        assert entry["rate"] > 0 and entry["eta_s"] > 0 and entry["gpu"] is None

        listing = cli("status", env=env)  # every project, by name
        assert listing.returncode == 0, listing.stderr
        lines = listing.stdout.splitlines()
        assert [line.split()[:2] for line in lines] == [["alpha", "running"], ["fresh", "new"]]
        assert "attempt 1" in lines[0] and "/40" in lines[0] and "it/s" in lines[0] and "eta " in lines[0]
        assert f"pid {run.proc.pid}" in lines[0]

        follower = subprocess.Popen(trainsup_cmd("logs", "-f", str(run.run_dir)), cwd=ROOT, env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        trainers = run.trainers()
        assert trainers
        stopped = cli("stop", "alpha", env=env)
        assert stopped.returncode == 0, stopped.stderr
        assert stopped.stdout.split()[:2] == ["alpha", "stopped"] and "exit 143" in stopped.stdout
        assert run.proc.wait(timeout=10) == 143
        assert run.status()["state"] == "stopped" and run.status()["reason"] == "stopped by SIGTERM"
        wait_until(lambda: gone(trainers), timeout=5, what="the trainer's processes to be gone")

        # The follower ends by itself once the supervisor is gone, having printed every byte.
        out, err = follower.communicate(timeout=10)
        assert follower.returncode == 0, err
        assert out == (run.run_dir / "attempt-1.log").read_bytes()
        assert err.decode().splitlines() == ["==> attempt-1.log <=="]
    finally:
        if follower is not None and follower.poll() is None:
            follower.kill()
            follower.communicate()
        run.end()
    again = cli("stop", str(run.run_dir), env=env)
    assert again.returncode == 0 and "nothing to stop" in again.stderr
    assert again.stdout.split()[1] == "stopped"


def test_a_run_started_by_hand_is_listed_at_once_and_dropped_with_its_run_dir(
        assets: dict[str, Path], tmp_path: Path, env: dict[str, str], runs_index: Path) -> None:
    """`trainsup run -- ...` with no project: `trainsup status` with no argument lists it within 2 s of
    its start (the supervisor registers its run dir in the box's index of runs as it begins)."""
    started = time.monotonic()
    run = Run(tmp_path, assets, env, steps=15)

    def listed() -> list[dict[str, Any]]:
        out, err = io.StringIO(), io.StringIO()
        assert run_status([], as_json=True, env=env, out=out, err=err) == 0, err.getvalue()
        return [e for e in json.loads(out.getvalue()) if e["run_dir"] == str(run.run_dir)]

    try:
        [entry] = wait_until(listed, timeout=30, interval=0.02, what="the run in `trainsup status`")  # type: ignore[misc]
        seen_after = time.monotonic() - started
        assert seen_after < 2.0, f"listed {seen_after:.2f} s after `trainsup run` started"
        assert entry["state"] in ("starting", "running") and entry["name"] == str(run.run_dir)
        run.wait_for_step(2)
        text = cli("status", env=env)
        [line] = [x for x in text.stdout.splitlines() if x.startswith(str(run.run_dir))]
        assert line.split()[1] == "running" and f"pid {run.proc.pid}" in line, text.stdout
        assert run.proc.wait(timeout=120) == 0
    finally:
        run.end()
    assert [e["state"] for e in listed()] == ["finished"]  # a recent run stays listed once it ended
    # --quiet: trainsup's own lines only, sentences with the facts, a progress line, one at each save
    said = (tmp_path / "run.stderr").read_text().splitlines()
    assert said and all(line.startswith("trainsup: ") for line in said), said
    assert "trainsup: attempt 1 starts from the beginning" in said
    assert any(line.startswith("trainsup: attempt 1: step ") and "/15" in line for line in said), said
    saved = [line for line in said if " is saved (" in line]
    assert saved and all(line.startswith("trainsup: step ") for line in saved), said
    assert said[-1].startswith("trainsup: training finished: the final weights are ")
    assert not any("None" in line or "=" in line.split(":", 1)[1].split("(")[0] for line in said), said
    assert len(list(runs_index.iterdir())) == 1
    shutil.rmtree(run.out)  # the run dir is gone: so is its entry
    assert listed() == [] and list(runs_index.iterdir()) == []


def test_logs_follow_a_restart_to_the_end_and_a_finished_run(assets: dict[str, Path], tmp_path: Path,
                                                            env: dict[str, str]) -> None:
    run = Run(tmp_path, assets, env, steps=12)
    follower = None
    try:
        wait_until(lambda: (run.run_dir / "attempt-1.log").exists(), timeout=30, what="attempt-1.log")
        follower = subprocess.Popen(trainsup_cmd("logs", "--follow", "--attempt", "1", str(run.run_dir)),
                                    cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        run.wait_for_step(2)
        for trainer in run.trainers():  # what a host OOM kill does: trainsup restarts it
            trainer.kill()
        out, err = follower.communicate(timeout=60)
        assert run.proc.wait(timeout=10) == 0
    finally:
        if follower is not None and follower.poll() is None:
            follower.kill()
            follower.communicate()
        run.end()
    first, second = ((run.run_dir / f"attempt-{n}.log").read_bytes() for n in (1, 2))
    assert follower.returncode == 0, err
    assert out == first + second
    assert err.decode().splitlines() == ["==> attempt-1.log <==", "==> attempt-2.log <=="]
    assert not (run.run_dir / "attempt-3.log").exists()

    logs = lambda *args: subprocess.run(trainsup_cmd("logs", *args), cwd=ROOT, env=env, capture_output=True,
                                        check=False)
    newest = logs(str(run.run_dir))
    assert newest.returncode == 0 and newest.stdout == second  # bytes as written: \r redraws and all
    assert logs("--attempt", "1", str(run.out)).stdout == first  # an output dir names its run too
    missing = cli("logs", "--attempt", "3", str(run.run_dir), env=env)
    assert missing.returncode == 1
    one_error_line(missing.stderr, "attempt-3.log", "attempts 1, 2")

    entry = status_of(str(run.run_dir), env)
    assert (entry["state"], entry["attempt"], entry["step"], entry["total"]) == ("finished", 2, 12, 12)
    assert entry["last_fault"] == "host_oom_killed" and entry["exit_code"] == 0 and entry["pid"] is None
    text = cli("status", str(run.run_dir), env=env).stdout
    assert text.split()[:2] == [str(run.run_dir), "finished"] and "step 12/12" in text
    assert "fault host_oom_killed" in text and "exit 0" in text and "eta" not in text


def test_a_lost_run_and_a_corrupt_status(assets: dict[str, Path], tmp_path: Path, env: dict[str, str]) -> None:
    run = Run(tmp_path, assets, env)
    trainers: list[psutil.Process] = []
    groups: set[int] = set()
    try:
        run.wait_for_step(1)
        trainers = run.trainers()
        groups = {os.getpgid(p.pid) for p in trainers}
        assert trainers and run.proc.pid not in groups  # the trainer has its own process group
        run.proc.send_signal(signal.SIGKILL)
        run.proc.wait(timeout=10)
    finally:
        for group in groups:
            try:
                os.killpg(group, signal.SIGKILL)  # nothing is left to stop it now
            except ProcessLookupError:
                pass
        run.end()
    wait_until(lambda: gone(trainers), timeout=10, what="the orphaned trainer to be gone")

    entry = status_of(str(run.run_dir), env)
    assert entry["state"] == "lost" and entry["pid"] is None and entry["attempt"] == 1
    assert "running" in entry["reason"] and "lock" in entry["reason"]
    line = cli("status", str(run.run_dir), env=env).stdout
    assert line.split()[1] == "lost" and "it/s" not in line
    stop = cli("stop", str(run.run_dir), env=env)
    assert stop.returncode == 0 and "nothing to stop" in stop.stderr and " lost " in stop.stdout

    (run.run_dir / "status.json").write_text('{"state": "runn')
    entry = status_of(str(run.run_dir), env)
    assert entry["state"] == "unknown" and "not valid JSON" in entry["reason"]
    text = cli("status", str(run.run_dir), env=env)
    assert text.returncode == 0 and text.stdout.split()[1] == "unknown" and "Traceback" not in text.stderr


def test_names_that_are_no_run_and_projects_that_never_ran(tmp_path: Path, env: dict[str, str]) -> None:
    projects = tmp_path / "projects"
    (projects / "fresh.yaml").write_text(yaml.safe_dump({"command": ["python", "train_network.py"],
                                                         "run_dir": str(tmp_path / "fresh-run")}))
    (projects / "broken.yaml").write_text("command: [python\n")
    listing = json.loads(cli("status", "--json", env=env).stdout)
    assert [(e["name"], e["state"]) for e in listing] == [("broken", "unknown"), ("fresh", "new")]
    assert "broken.yaml" in listing[0]["reason"] and listing[1]["run_dir"] == str(tmp_path / "fresh-run")

    for verb, code in (("status", 2), ("logs", 2), ("stop", 2)):
        done = cli(verb, str(tmp_path / "nowhere"), env=env)
        assert done.returncode == code, (verb, done.stderr)
        one_error_line(done.stderr, f"trainsup {verb}: error:", "nowhere", "neither a run dir", "nor a project")
    never = cli("logs", "fresh", env=env)
    assert never.returncode == 1
    one_error_line(never.stderr, "no attempt log")
    stop = cli("stop", "fresh", env=env)
    assert stop.returncode == 0 and stop.stdout.split()[:2] == ["fresh", "new"]
    empty = cli("status", "--json", env={**env, "TRAINSUP_PROJECTS": str(tmp_path / "none")})
    assert (empty.returncode, json.loads(empty.stdout)) == (0, [])


# Holds a run dir's lock as a supervisor does and writes its pid, but ignores SIGTERM.
STUBBORN = """
import fcntl, json, os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
fh = open(os.path.join(sys.argv[1], "lock"), "a+")
fcntl.flock(fh, fcntl.LOCK_EX)
fh.write(json.dumps({"pid": os.getpid(), "started": time.time()}) + "\\n")
fh.flush()
print("held", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize(("argv0", "code", "says"), [
    ("stand-in", 1, "is not a trainsup process; not signalling it"),
    ("trainsup-stand-in", 1, "still running after 0.5 s"),
])
def test_stop_signals_only_the_lock_holder_it_can_vouch_for_and_says_when_it_did_not_stop(
        tmp_path: Path, env: dict[str, str], argv0: str, code: int, says: str) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    holder = subprocess.Popen(["python3", "-c", STUBBORN, str(run_dir), argv0], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        done = cli("stop", "--timeout", "0.5", str(run_dir), env=env)
        assert done.returncode == code
        one_error_line(done.stderr, says, str(holder.pid))
        assert holder.poll() is None
    finally:
        holder.kill()
        holder.communicate()


def test_eta_and_duration() -> None:
    assert eta_seconds(100, 2000, 2.0) == 950.0
    assert eta_seconds(2000, 2000, 2.0) == 0.0
    assert eta_seconds(100, 2000, None) is None and eta_seconds(100, None, 2.0) is None
    assert eta_seconds(100, 2000, 0.0) is None and eta_seconds(100, 2000, float("nan")) is None
    assert [format_duration(s) for s in (0, 42.4, 60, 1016, 3600, 10920, 183600)] == \
        ["0s", "42s", "1m00s", "16m56s", "1h00m", "3h02m", "2d03h"]


def test_a_line_says_what_is_known_and_only_live_gpus() -> None:
    gpu = [{"index": 0, "used_mib": 18636.8, "total_mib": 24576, "trainer_mib": 17000},
           {"index": 1, "used_mib": None, "total_mib": 24576}]
    live = RunView("alpha", "running", "/r", attempt=2, step=100, total=2000, loss=0.09123, rate=1.853,
                   eta_s=1025.4, last_fault="cuda_oom", gpu=gpu, pid=42)
    assert format_line(live, 6) == ("alpha   running    attempt 2  step 100/2000  loss 0.09123  1.85 it/s  "
                                    "eta 17m05s  fault cuda_oom  gpu0 18.2/24.0 GiB  gpu1 ?/24.0 GiB  pid 42")
    done = RunView("alpha", "gave_up", "/r", attempt=5, step=10, gpu=gpu, exit_code=3, rate=2.0,
                   reason="restart budget spent")
    assert format_line(done) == "alpha  gave_up    attempt 5  step 10  exit 3  (restart budget spent)"
