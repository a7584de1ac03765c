"""`trainsup run` over the real OneTrainer (``scripts/train.py``, an SD1.5 LoRA on the CPU): a clean
run, a SIGKILL after a backup resumed exactly, a kill in the middle of writing a backup, and the
device-mismatch seed fault injected at the real place (``sitecustomize.py`` beside this file).

Runs are short (1-2 epochs of 8 steps, a backup every 5 steps): 25-50 s each on two cores. Every
test checks that the user's config, concept and sample files are byte-identical afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Any

from tests.e2e.demo_harness import supervise
from tests.real_onetrainer.bed import OTBed, digests, trainer_process

POLICY = "backoff:\n  initial_s: 0.5\n  max_s: 1\nstop:\n  grace_s: 20\n"
HERE = Path(__file__).resolve().parent


def user_inputs(tmp: Path) -> dict[str, str]:
    return digests(tmp / "config.json", tmp / "concepts.json", tmp / "samples.json")


def test_a_clean_run_finishes_with_the_model_written_and_no_fault(ot_bed: OTBed, tmp_path: Path) -> None:
    cfg = ot_bed.user_files(tmp_path, epochs=1)
    before = user_inputs(tmp_path)
    run = supervise(ot_bed.command(cfg), tmp_path / "ws", tmp_path, env=ot_bed.env(), policy=POLICY,
                    cwd=ot_bed.cwd, timeout=400)
    assert run.returncode == 0, run.stderr[-3000:]
    assert not run.of("fault")
    assert [e["attempt"] for e in run.of("attempt_start")] == [1]
    assert run.of("finished")[0]["final_weights"] == str(tmp_path / "lora.safetensors")
    assert (tmp_path / "lora.safetensors").stat().st_size > 0
    assert sorted(s["step"] for s in run.of("state_saved")) == [4, 8]
    assert user_inputs(tmp_path) == before


def test_a_kill_after_a_backup_resumes_it_and_ends_as_a_plain_resume_of_that_backup(
        ot_bed: OTBed, tmp_path: Path) -> None:
    cfg = ot_bed.user_files(tmp_path, epochs=2)
    before = user_inputs(tmp_path)
    killed: dict[str, Any] = {}

    def kill_after_backup_9(event: dict[str, Any]) -> None:
        if event["event"] == "state_saved" and event["step"] == 9 and not killed:
            trainer = trainer_process()
            assert trainer is not None
            os.kill(trainer.pid, signal.SIGKILL)
            killed["dir"] = event["dir"]
            # The ancestor, as it was: the reference run resumes from a copy of it.
            shutil.copytree(event["dir"], tmp_path / "ref" / "ws" / "backup" / Path(event["dir"]).name)

    run = supervise(ot_bed.command(cfg), tmp_path / "ws", tmp_path, env=ot_bed.env(), policy=POLICY,
                    cwd=ot_bed.cwd, on_event=kill_after_backup_9, timeout=500)
    assert run.returncode == 0, run.stderr[-3000:]
    assert killed, "trainsup never journaled the backup of step 9"
    assert run.of("attempt_end")[0]["signal"] == 9
    start = run.of("attempt_start")[-1]
    assert (start["attempt"], start["resume_from"], start["resume_step"]) == (2, killed["dir"], 9)
    derived = json.loads(Path(start["argv"][start["argv"].index("--config-path") + 1]).read_text())
    assert derived["continue_last_backup"] is True
    log = (run.run_dir / "attempt-2.log").read_text(errors="replace")
    assert f"Continuing training from backup '{killed['dir']}'" in log
    assert user_inputs(tmp_path) == before
    # The same backup resumed by OneTrainer alone, with the config trainsup derived.
    ref = tmp_path / "ref"
    doc = dict(derived, workspace_dir=str(ref / "ws"), cache_dir=str(ref / "cache"),
               output_model_destination=str(ref / "lora.safetensors"))
    (ref / "config.json").write_text(json.dumps(doc, indent=4))
    plain = ot_bed.run_plain(ref / "config.json")
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert ot_bed.max_abs_diff(tmp_path / "lora.safetensors", ref / "lora.safetensors") == 0.0


# The kill inside a backup waits for a window of ~0.2 s (optimizer.pt written, meta.json not yet): on
# loaded cores the watcher can miss it, so the backup is held open there (sitecustomize.py beside this file)
SLOW_BACKUP = {"PYTHONPATH": str(Path(__file__).resolve().parent), "TRAINSUP_OT_SLOW_OPTIMIZER_SAVE_S": "1.5"}


class KillInBackup(threading.Thread):
    """SIGKILL the trainer the moment a backup of ``step`` has its optimizer folder but no meta.json:
    in the middle of writing it."""

    def __init__(self, backup_dir: Path, step: int, timeout: float = 400) -> None:
        super().__init__(daemon=True)
        self.backup_dir, self.step, self.timeout = backup_dir, step, timeout
        self.partial: Path | None = None

    def run(self) -> None:
        deadline = time.monotonic() + self.timeout
        trainer = None
        while time.monotonic() < deadline and self.partial is None:
            trainer = trainer or trainer_process()
            for d in self.backup_dir.glob(f"*-backup-{self.step}-*"):
                if (d / "optimizer").exists() and not (d / "meta.json").exists() and trainer is not None:
                    trainer.kill()
                    self.partial = d
                    return
            time.sleep(0.001)


def test_a_kill_while_a_backup_is_written_sets_it_aside_and_resumes_the_one_before(
        ot_bed: OTBed, tmp_path: Path) -> None:
    cfg = ot_bed.user_files(tmp_path, epochs=2)
    before = user_inputs(tmp_path)
    killer = KillInBackup(tmp_path / "ws" / "backup", 9)
    killer.start()
    run = supervise(ot_bed.command(cfg), tmp_path / "ws", tmp_path, env=ot_bed.env(**SLOW_BACKUP), policy=POLICY,
                    cwd=ot_bed.cwd, timeout=500)
    killer.join(timeout=5)
    assert run.returncode == 0, run.stderr[-3000:]
    assert killer.partial is not None, "the kill never landed inside the backup of step 9"
    assert run.of("attempt_end")[0]["signal"] == 9
    start = run.of("attempt_start")[1]
    assert start["resume_step"] == 4 and "-backup-4-0-4" in start["resume_from"]
    aside = [e for e in run.of("state_set_aside") if e["dir"] == str(killer.partial)]
    assert aside and Path(aside[0]["to"]).is_dir() and not killer.partial.exists()
    assert all(str(killer.partial) != s["dir"] for s in run.of("state_saved"))
    assert (tmp_path / "lora.safetensors").is_file()
    assert user_inputs(tmp_path) == before


def test_device_mismatch_with_latent_caching_resumes_with_latent_caching_off(ot_bed: OTBed, tmp_path: Path) -> None:
    cfg = ot_bed.user_files(tmp_path, epochs=1)
    before = user_inputs(tmp_path)
    env = ot_bed.env(PYTHONPATH=str(HERE), TRAINSUP_OT_FAULT="device_mismatch", TRAINSUP_OT_FAULT_STEP="6")
    run = supervise(ot_bed.command(cfg), tmp_path / "ws", tmp_path, env=env, policy=POLICY, cwd=ot_bed.cwd,
                    timeout=500)
    assert run.returncode == 0, run.stderr[-3000:]
    assert [f["class"] for f in run.of("fault")] == ["device_mismatch"]
    assert "Expected all tensors to be on the same device" in run.of("fault")[0]["evidence"]
    start = run.of("attempt_start")[1]
    assert start["resume_step"] == 4
    derived = json.loads(Path(start["argv"][start["argv"].index("--config-path") + 1]).read_text())
    assert derived["latent_caching"] is False and derived["continue_last_backup"] is True
    assert json.loads(cfg.read_text()).get("latent_caching", True) is True  # on: the default
    assert run.of("finished") and (tmp_path / "lora.safetensors").is_file()
    assert user_inputs(tmp_path) == before


def test_a_config_edit_applies_at_the_next_backup_through_a_sigint_stop_and_a_fresh_derived_config(
        ot_bed: OTBed, tmp_path: Path) -> None:
    cfg = ot_bed.user_files(tmp_path, epochs=2)
    edited: dict[str, bytes] = {}

    def edit_after_backup_4(event: dict[str, Any]) -> None:
        if event["event"] == "state_saved" and event["step"] == 4 and not edited:
            doc = json.loads(cfg.read_text())
            doc["learning_rate"] = 0.0001
            cfg.write_text(json.dumps(doc, indent=4))
            edited["config"] = cfg.read_bytes()

    run = supervise(ot_bed.command(cfg), tmp_path / "ws", tmp_path, env=ot_bed.env(), policy=POLICY,
                    cwd=ot_bed.cwd, on_event=edit_after_backup_4, timeout=500)
    assert run.returncode == 0, run.stderr[-3000:]
    assert edited and run.of("change_scheduled") and not run.of("fault")
    first, second = run.of("attempt_end")[0], run.of("attempt_start")[1]
    assert first["exit_code"] == 0  # SIGINT: OneTrainer backed up and exited by itself
    log = (run.run_dir / "attempt-1.log").read_text(errors="replace")
    assert log.count("Creating Backup") >= 3  # 4, 9, and the one SIGINT asked for
    assert second["resume_step"] >= 9
    derived = json.loads(Path(second["argv"][second["argv"].index("--config-path") + 1]).read_text())
    assert derived["learning_rate"] == 0.0001 and derived["continue_last_backup"] is True
    assert [e["attempt"] for e in run.of("change_applied")] == [2]
    assert cfg.read_bytes() == edited["config"]  # the user's edit, untouched
    assert run.of("finished") and (tmp_path / "lora.safetensors").is_file()


def test_a_failed_final_save_switches_to_kohya_lora_and_resumes_the_backup_before_the_end_backup(
        ot_bed: OTBed, tmp_path: Path) -> None:
    cfg = ot_bed.user_files(tmp_path, epochs=1, output_model_format="SAFETENSORS")
    before = user_inputs(tmp_path)
    run = supervise(ot_bed.command(cfg), tmp_path / "ws", tmp_path, env=ot_bed.env(), policy=POLICY,
                    cwd=ot_bed.cwd, timeout=500)
    assert run.returncode == 0, run.stderr[-3000:]
    assert [f["class"] for f in run.of("fault")] == ["output_format"]
    assert run.of("attempt_end")[0]["exit_code"] == 1
    start = run.of("attempt_start")[1]
    # The end backup (-8-1-0: epoch == epochs) would train nothing and save nothing: the one before it.
    assert start["resume_step"] == 4 and "-backup-4-0-4" in start["resume_from"]
    derived = json.loads(Path(start["argv"][start["argv"].index("--config-path") + 1]).read_text())
    assert derived["output_model_format"] == "KOHYA_LORA"
    assert any("-backup-8-1-0" in e["dir"] for e in run.of("state_set_aside"))
    assert run.of("finished")[0]["final_weights"] == str(tmp_path / "lora.safetensors")
    assert user_inputs(tmp_path) == before
