"""The deadline signal outside Slurm (no SLURM_JOB_ID): SIGCONT changes nothing, SIGUSR1 stops the run
at a complete state with exit 138 and no requeue, the trainer's whole tree gone before trainsup exits;
a second `trainsup run` resumes from that state. Real processes and signals (the Slurm side: tests/slurm)."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import psutil

from tests.conftest import ROOT, trainsup_cmd
from tests.e2e.demo_harness import FAST_POLICY, clean_env, demo_argv, supervise
from trainsup.demo.story import follow
from trainsup.record.journal import read_events


def demo_processes(out: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if cmd[1:3] and cmd[1] == "-m" and cmd[2].startswith("trainsup.demo.") and str(out) in cmd:
            found.append(proc)
    return found


def test_usr1_outside_slurm_stops_at_a_complete_state_with_138_and_no_requeue(
        assets: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    pol = tmp_path / "policy.yaml"
    pol.write_text(FAST_POLICY + "slurm:\n  lead_s: 120\n")
    argv = demo_argv("train_network", assets, out)
    env = clean_env(TRAINSUP_DEMO_STEP_SECONDS="0.2")
    env.pop("SLURM_JOB_ID", None)
    proc = subprocess.Popen(trainsup_cmd("run", "--quiet", "--policy", str(pol), "--", *argv), cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    sent: list[int] = []
    alive_at_end: list[list[psutil.Process]] = []

    def on_event(event: dict[str, object]) -> None:
        if event["event"] == "state_saved" and event["step"] == 8 and not sent:
            proc.send_signal(signal.SIGCONT)  # what Slurm sends first: nothing happens
            proc.send_signal(signal.SIGUSR1)
            sent.append(proc.pid)
        if event["event"] == "not_requeued":
            alive_at_end.append([p for p in demo_processes(out) if p.status() != psutil.STATUS_ZOMBIE])

    try:
        follow(proc, out / ".trainsup", on_event, timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    err = proc.stderr.read() if proc.stderr else ""
    assert proc.returncode == 138, err[-3000:]
    events = read_events(out / ".trainsup")
    deadline = [e for e in events if e["event"] == "deadline"]
    assert sent and len(deadline) == 1 and deadline[0]["wait_for_save"] is True, err[-3000:]
    assert [e["state_step"] for e in events if e["event"] == "not_requeued"] == [12]
    assert alive_at_end == [[]]
    assert "SIGUSR1: the save is complete: stopping" in err and "Traceback" not in err
    assert "not in a Slurm job (no SLURM_JOB_ID): not requeued" in err
    # The next run resumes from that state and finishes.
    again = supervise(argv, out, tmp_path, env=clean_env())
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.of("attempt_start")[-1]["resume_step"] == 12
