"""trainsup inside real Slurm jobs (issue 23): sbatch scripts as a user writes them (``--requeue
--open-mode=append --signal=B:USR1@300``, ``exec trainsup run``), the demo trainer, a real
slurmctld/slurmd. ``scancel -b -s USR1`` stands in for the deadline signal (what ``--signal`` sends,
without waiting for a time limit); a requeued job runs again ~6 s after the requeue.

A real trainer (LitGPT's bed) runs in these jobs in ``test_slurm_real.py``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from tests.conftest import CHILDREN, ROOT
from tests.e2e.demo_harness import assert_same_weights, clean_env, demo_argv, run_plain
from trainsup.record.journal import read_events

TRAINSUP = Path(sys.executable).parent / "trainsup"
CHILD = str(CHILDREN / "train_network.py")  # its `tree` mode: a trainer with a child and a grandchild
POLICY = "stop:\n  grace_s: 5\nbackoff:\n  initial_s: 1\n  max_s: 2\n"


def submit(tmp: Path, slurm: dict[str, str], argv: list[str], policy: str = POLICY,
           env: dict[str, str] | None = None, lead: int = 300, time_limit: str = "") -> tuple[str, Path]:
    """Write an sbatch script for ``trainsup run -- argv`` and submit it; the job id and its log."""
    (tmp / "policy.yaml").write_text(policy)
    log = tmp / "slurm.log"
    script = tmp / "job.sbatch"
    quoted = " ".join(f"'{a}'" for a in argv)
    script.write_text(f"""#!/bin/bash
#SBATCH --job-name=trainsup-test
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --signal=B:USR1@{lead}
#SBATCH --output={log}{time_limit and f"{chr(10)}#SBATCH --time={time_limit}"}
#SBATCH --chdir={ROOT}
echo "slurm_restart_count=${{SLURM_RESTART_COUNT:-unset}}"
exec {TRAINSUP} run --quiet --policy {tmp / 'policy.yaml'} -- {quoted}
""")
    done = subprocess.run(["sbatch", "--parsable", str(script)], env={**slurm, **(env or clean_env())},
                          capture_output=True, text=True, timeout=30, check=True)
    return done.stdout.strip().split(";")[0], log


def job(slurm: dict[str, str], jid: str) -> dict[str, str]:
    done = subprocess.run(["scontrol", "show", "job", "-o", jid], env=slurm, capture_output=True, text=True,
                          timeout=30, check=True)
    return dict(tok.split("=", 1) for tok in done.stdout.split() if "=" in tok)


def wait_for(what: str, predicate: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def ended(slurm: dict[str, str], jid: str, timeout: float = 240) -> dict[str, str]:
    return wait_for(f"job {jid} to end", lambda: (j := job(slurm, jid))["JobState"] in
                    ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT") and j, timeout)


def events(out: Path) -> list[dict[str, Any]]:
    return read_events(out / ".trainsup") if (out / ".trainsup" / "events.jsonl").exists() else []


def of(out: Path, kind: str) -> list[dict[str, Any]]:
    return [e for e in events(out) if e["event"] == kind]


def usr1(slurm: dict[str, str], jid: str) -> None:
    subprocess.run(["scancel", "-b", "-s", "USR1", jid], env=slurm, timeout=30, check=True)


def alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def processes_of(out: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if str(out) in " ".join(proc.info["cmdline"] or ()) and proc.pid != os.getpid():
            found.append(proc)
    return found


def test_clean_job_completes_with_exit_0(slurm: dict[str, str], assets: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    jid, log = submit(tmp_path, slurm, demo_argv("train_network", assets, out, steps=8))
    j = ended(slurm, jid)
    assert (j["JobState"], j["ExitCode"], j["Restarts"]) == ("COMPLETED", "0:0", "0"), log.read_text()[-2000:]
    assert of(out, "finished") and (out / "lora.safetensors").exists()


def test_deadline_signal_requeues_and_resumes_to_the_same_weights(
        slurm: dict[str, str], assets: dict[str, Path], tmp_path: Path) -> None:
    ref = tmp_path / "ref"
    assert run_plain(demo_argv("train_network", assets, ref)).returncode == 0
    out = tmp_path / "out"
    jid, log = submit(tmp_path, slurm, demo_argv("train_network", assets, out),
                      env=clean_env(TRAINSUP_DEMO_STEP_SECONDS="0.25"))
    # Two saves measured (steps 4 and 8): the next (12) is due long before the 300 s deadline.
    wait_for("the state of step 8", lambda: any(e["step"] == 8 for e in of(out, "state_saved")), 120)
    usr1(slurm, jid)
    wait_for("the requeue", lambda: of(out, "requeued"), 60)
    requeued = of(out, "requeued")[0]
    assert requeued["job_id"] == jid and requeued["restart_count"] is None and requeued["state_step"] == 12
    deadline = of(out, "deadline")[0]
    assert deadline["signal"] == "SIGUSR1" and deadline["wait_for_save"] is True
    j = ended(slurm, jid)
    text = log.read_text()
    assert (j["JobState"], j["ExitCode"], j["Restarts"]) == ("COMPLETED", "0:0", "1"), text[-3000:]
    # The log was appended: the first run's lines, Slurm's requeue line, the second run's.
    assert text.index("slurm_restart_count=unset") < text.index("DUE TO JOB REQUEUE") \
        < text.index("slurm_restart_count=1"), text[-3000:]
    starts = of(out, "attempt_start")
    assert starts[-1]["resume_from"] == str(out / "lora-step00000012-state") and starts[-1]["resume_step"] == 12
    stops = [e for e in of(out, "gave_up") if "deadline" in e["reason"]]
    assert stops and stops[0]["exit_code"] == 138
    assert_same_weights(out / "lora.safetensors", ref / "lora.safetensors")


def test_fault_a_restart_cannot_fix_fails_and_is_never_requeued(
        slurm: dict[str, str], assets: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    jid, log = submit(tmp_path, slurm, demo_argv("train_network", assets, out, "--lowvram"))
    j = ended(slurm, jid)
    assert (j["JobState"], j["ExitCode"], j["Restarts"]) == ("FAILED", "4:0", "0"), log.read_text()[-2000:]
    assert [f["class"] for f in of(out, "fault")] == ["config_error"] and not of(out, "requeued")


def test_scancel_is_sigterm_exit_143_and_no_process_of_the_trainers_tree_is_left(
        slurm: dict[str, str], tmp_path: Path) -> None:
    """The trainer, its child and its grandchild (in a session of its own) all ignore SIGTERM, so
    Slurm's own SIGTERM to the job's processes (linuxproc signals the whole tree) stops none of them.
    Were trainsup to exit on it at once, they would be re-parented away from slurmstepd, and Slurm
    would never kill them (the sandbox's finding (3): a 143 job whose child and grandchild lived on).
    trainsup SIGKILLs them after stop.grace_s (2 s: under the sandbox's KillWait, 5 s, after which
    Slurm SIGKILLs trainsup too) and exits 143 only once they are gone."""
    out = tmp_path / "out"
    pidfile = tmp_path / "pids"
    jid, log = submit(tmp_path, slurm, [sys.executable, CHILD, "tree", str(pidfile), "--output_dir", str(out)],
                      policy=POLICY.replace("grace_s: 5", "grace_s: 2"))
    wait_for("the trainer's tree", pidfile.exists, 120)
    tree = [psutil.Process(int(pid)) for pid in pidfile.read_text().split()]
    assert len(tree) == 3 and all(alive(p) for p in tree)
    assert len({os.getsid(p.pid) for p in tree}) == 2  # the grandchild left the trainer's session
    subprocess.run(["scancel", jid], env=slurm, timeout=30, check=True)
    j = ended(slurm, jid, timeout=60)
    assert (j["JobState"], j["ExitCode"], j["Restarts"]) == ("CANCELLED", "143:0", "0"), log.read_text()[-2000:]
    assert [p.pid for p in tree if alive(p)] == [], "left of the trainer's tree after the job ended"
    assert not of(out, "requeued") and of(out, "gave_up")[-1]["exit_code"] == 143
    left = [p for p in processes_of(out) if alive(p)]
    assert not left, [p.info["cmdline"] for p in left]


def test_requeue_budget_spent_without_progress_fails_with_exit_3(
        slurm: dict[str, str], assets: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    policy = POLICY + "slurm:\n  requeue_budget: 1\n"
    jid, log = submit(tmp_path, slurm, demo_argv("train_network", assets, out, steps=400, save_every=200),
                      policy=policy, env=clean_env(TRAINSUP_DEMO_STEP_SECONDS="0.25"))
    for run in (1, 2):  # a deadline before any save, twice: the second requeue would make no progress
        wait_for(f"run {run}'s trainer", lambda run=run: len(of(out, "attempt_start")) >= run, 120)
        usr1(slurm, jid)
        if run == 1:
            wait_for("the requeue", lambda: of(out, "requeued"), 60)
    j = ended(slurm, jid)
    assert (j["JobState"], j["ExitCode"], j["Restarts"]) == ("FAILED", "3:0", "1"), log.read_text()[-3000:]
    assert len(of(out, "requeued")) == 1 and of(out, "requeue_budget_spent")[0]["restart_count"] == "1"
    assert all(e["wait_for_save"] is False for e in of(out, "deadline"))


def test_the_real_signal_before_a_time_limit_reaches_trainsup_and_requeues(
        slurm: dict[str, str], assets: dict[str, Path], tmp_path: Path) -> None:
    """`--time=1 --signal=B:USR1@55`: slurmctld sends USR1 at its first look (it looks every 30 s), to
    trainsup through `exec`; trainsup stops after a save and requeues. Cancelled once requeued."""
    out = tmp_path / "out"
    jid, log = submit(tmp_path, slurm, demo_argv("train_network", assets, out, steps=400),
                      policy=POLICY + "slurm:\n  lead_s: 55\n", env=clean_env(TRAINSUP_DEMO_STEP_SECONDS="0.25"),
                      lead=55, time_limit="1")
    try:
        wait_for("the requeue", lambda: of(out, "requeued"), 90)
        deadline = of(out, "deadline")[0]
        assert deadline["signal"] == "SIGUSR1" and deadline["wait_for_save"] is True, deadline
        started = of(out, "run_start")[0]["ts"]
        assert deadline["ts"] - started < 35  # the signal came at slurmctld's first look
        assert of(out, "requeued")[0]["state_step"] == max(e["step"] for e in of(out, "state_saved"))
        wait_for("the second run", lambda: "slurm_restart_count=1" in log.read_text(), 60)
    finally:
        subprocess.run(["scancel", jid], env=slurm, timeout=30, check=False)
    assert ended(slurm, jid, timeout=60)["Restarts"] == "1"
