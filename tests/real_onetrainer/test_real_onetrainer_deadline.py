"""The deadline signal over the real OneTrainer (``scripts/train.py``, an SD1.5 LoRA on the CPU): its
adapter stops with SIGINT, which makes OneTrainer back up before it exits, so at SIGUSR1 trainsup
stops it now with SIGINT rather than waiting for the next periodic backup; that backup is the resume
point, and the next `trainsup run` resumes from it and finishes (about 80 s on two cores)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from tests.e2e.demo_harness import supervise
from tests.real_onetrainer.bed import OTBed, trainer_process

# The stop grace is under the launch-to-first-backup interval even on an idle machine (12 s seen), and
# well over the 6 s the SIGINT backup takes.
POLICY = "backoff:\n  initial_s: 0.5\n  max_s: 1\nstop:\n  grace_s: 9\nslurm:\n  lead_s: 600\n"


def test_a_deadline_signal_makes_onetrainer_back_up_now_and_the_next_run_resumes_from_it(
        ot_bed: OTBed, tmp_path: Path) -> None:
    cfg = ot_bed.user_files(tmp_path, epochs=2, backup_after=10)  # backups at steps 9 and 14
    env = ot_bed.env()
    env.pop("SLURM_JOB_ID", None)
    sent: dict[str, Any] = {}

    def usr1_after_backup_9(event: dict[str, Any]) -> None:
        if event["event"] == "state_saved" and event["step"] == 9 and not sent:
            trainer = trainer_process()
            assert trainer is not None
            os.kill(trainer.ppid(), signal.SIGUSR1)  # trainsup, the trainer's parent (Slurm's B: does this)
            sent["dir"] = event["dir"]

    run = supervise(ot_bed.command(cfg), tmp_path / "ws", tmp_path, env=env, policy=POLICY, cwd=ot_bed.cwd,
                    on_event=usr1_after_backup_9, timeout=400)
    assert run.returncode == 138, run.stderr[-3000:]
    assert sent, "trainsup never journaled the backup of step 9"
    (deadline,) = run.of("deadline")
    # The periodic backup is due one launch-to-first-backup interval later (loading included: 20 s and
    # more), after the 9 s stop grace the SIGINT backup is given (it took about 6 s): that one comes first.
    assert (deadline["choice"], deadline["save_signal"]) == ("save_on_stop", "SIGINT"), deadline
    assert "stopping now with SIGINT" in run.stderr
    (end,) = run.of("attempt_end")
    assert end["exit_code"] == 0 and not run.of("fault")  # OneTrainer backed up and exited by itself
    (kept,) = run.of("not_requeued")
    assert kept["state_step"] > 9, kept  # the backup SIGINT asked for, not the periodic one of step 9
    log = (run.run_dir / "attempt-1.log").read_text(errors="replace")
    assert log.count("Creating Backup") >= 2
    # The next run resumes from that backup and finishes.
    again = supervise(ot_bed.command(cfg), tmp_path / "ws", tmp_path, env=env, policy=POLICY, cwd=ot_bed.cwd,
                      timeout=400)
    assert again.returncode == 0, again.stderr[-3000:]
    start = again.of("attempt_start")[-1]  # the journal goes on: the second run's
    assert start["resume_step"] == kept["state_step"] and start["resume_from"] != sent["dir"]
    assert again.of("finished") and (tmp_path / "lora.safetensors").is_file()
