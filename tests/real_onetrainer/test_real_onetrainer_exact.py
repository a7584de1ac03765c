"""An interrupted OneTrainer run ends as if it had never been interrupted (real ``scripts/train.py``).

Each case runs the user's command once bare (the reference) and once under `trainsup run`, where the
trainer is killed -9 at a step picked by a seeded draw (``TRAINSUP_KILL_SEED``): between two backups,
or inside the writing of one. Then ``backup/`` must list the backups the reference made (the same
steps, epochs and epoch steps in the names; OneTrainer puts the wall-clock time in front, which no
two runs share), the journal must count exactly the steps asked for, and each backup's LoRA and the
final model must hold the reference's tensors exactly (OneTrainer's resume is bit-exact: the bed's
README).

OneTrainer seeds nothing globally, so two bare runs start from different LoRA weights. Both runs
here pin torch's generator at interpreter start (``TRAINSUP_OT_SEED`` in ``sitecustomize.py``
beside this file); a resume does not depend on it.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.e2e.demo_harness import supervise
from tests.real_onetrainer.bed import OTBed, trainer_process
from tests.real_onetrainer.test_real_onetrainer import POLICY, SLOW_BACKUP, KillInBackup

HERE = Path(__file__).resolve().parent
SEED = int(os.environ.get("TRAINSUP_KILL_SEED", "20"))
EPOCHS, PER_EPOCH = 2, 8  # 16 steps; backups after 4, 9 and 14 steps, and the end backup of 16
STEPS = EPOCHS * PER_EPOCH
_NAME = re.compile(r"^\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2}-(backup-\d+-\d+-\d+)$")


def seeded_env(bed: OTBed) -> dict[str, str]:
    return bed.env(PYTHONPATH=str(HERE), TRAINSUP_OT_SEED="7", PYTHONUNBUFFERED="1")


def backups(ws: Path) -> dict[str, Path]:
    """The backups ``backup/`` shows, by name without the time, each once."""
    found: dict[str, Path] = {}
    for d in sorted((ws / "backup").iterdir()):
        m = _NAME.match(d.name)
        assert m is not None, f"not a backup name: {d.name}"
        assert m.group(1) not in found, f"two backups of one step: {found.get(m.group(1))} and {d}"
        found[m.group(1)] = d
    return found


def files_of(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def reference(ot_bed: OTBed, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("ot-reference")
    cfg = ot_bed.user_files(tmp, epochs=EPOCHS)
    done = subprocess.run(ot_bed.command(cfg), cwd=ot_bed.cwd, env=seeded_env(ot_bed), capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(backups(tmp / "ws")) == ["backup-14-1-6", "backup-16-2-0", "backup-4-0-4", "backup-9-1-1"]
    return tmp


class KillAtStep(threading.Thread):
    """SIGKILL the trainer once `trainsup status` shows ``step`` (between two backups)."""

    def __init__(self, status: Path, step: int, timeout: float = 400) -> None:
        super().__init__(daemon=True)
        self.status, self.step, self.timeout = status, step, timeout
        self.killed_at: int | None = None

    def run(self) -> None:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            try:
                now = json.loads(self.status.read_text())
            except (OSError, ValueError):
                now = {}
            trainer = trainer_process()
            if trainer is not None and int(now.get("step") or 0) >= self.step:
                trainer.kill()
                self.killed_at = int(now["step"])
                return
            time.sleep(0.005)


@pytest.mark.parametrize("where", ["between backups", "inside a backup"])
def test_a_kill_at_a_seeded_step_ends_with_the_uninterrupted_runs_backups_and_weights(
        ot_bed: OTBed, reference: Path, tmp_path: Path, where: str) -> None:
    draw = random.Random(f"{SEED}-{where}")
    cfg = ot_bed.user_files(tmp_path, epochs=EPOCHS)
    ws = tmp_path / "ws"
    killer: KillAtStep | KillInBackup
    if where == "between backups":
        step = draw.choice([10, 11, 12, 13])  # after the backup of step 9, before the one of step 14
        killer = KillAtStep(ws / ".trainsup" / "status.json", step)
    else:
        step = draw.choice([9, 14])  # killed while that backup's files are being written
        killer = KillInBackup(ws / "backup", step)
    killer.start()
    env = seeded_env(ot_bed) if where == "between backups" else {**seeded_env(ot_bed), **SLOW_BACKUP}
    run = supervise(ot_bed.command(cfg), ws, tmp_path, env=env, policy=POLICY, cwd=ot_bed.cwd, timeout=600)
    killer.join(timeout=5)
    landed = killer.killed_at if isinstance(killer, KillAtStep) else killer.partial
    assert landed is not None, f"the kill never landed ({where}, step {step}, seed {SEED})"
    assert run.returncode == 0, run.stderr[-3000:]
    assert [f["class"] for f in run.of("fault")] == ["host_oom_killed"]
    start, end = run.of("attempt_start")[-1], run.of("attempt_end")[-1]
    # Exactly the steps asked for: the last attempt trains from its backup to the end, never past.
    assert start["resume_step"] + end["steps_trained"] == STEPS, (start, end)
    status = json.loads((ws / ".trainsup" / "status.json").read_text())
    assert (status["state"], status["step"]) == ("finished", STEPS), status
    # The backups an uninterrupted run makes, each with its files, and no second copy of a step.
    ours, ref = backups(ws), backups(reference / "ws")
    assert sorted(ours) == sorted(ref)
    for name, d in ours.items():
        assert files_of(d) == files_of(ref[name]), name
        assert ot_bed.max_abs_diff(d / "lora" / "lora.safetensors", ref[name] / "lora" / "lora.safetensors") == 0.0
    assert ot_bed.max_abs_diff(tmp_path / "lora.safetensors", reference / "lora.safetensors") == 0.0
    # What trainsup took out of sight went to its run dir, whole: the cut backup, the resumed step's copy.
    for event in run.of("save_hidden") + run.of("state_set_aside"):
        assert Path(event["to"]).is_dir() and not Path(event["dir"]).exists(), event
    assert [e["step"] for e in run.of("save_hidden")] == [start["resume_step"]]
    print(f"killed {where} at step {step} (seed {SEED}): resumed at {start['resume_step']}, max |dw| 0")
