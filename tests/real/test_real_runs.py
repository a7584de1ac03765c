"""`trainsup run` over the real sd-scripts train_network.py: a frozen trainer (a hang).

The user's command is passed unchanged. These runs are the truth the demo trainer imitates: each
assertion here is about what the real trainer printed and wrote, not about the demo. The clean run,
the killed trainer, the state cut mid-save, the remedied fault and the SIGTERM run on this trainer
are in the behaviour suite (tests/behaviour: written once for every adapter's real trainer, with
sd-scripts' own assertions in its bed, tests/behaviour/beds.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Any

from tests.e2e.demo_harness import supervise
from tests.real.bed import Bed, trainer_process, trainsup_pid_of

POLICY = "backoff:\n  initial_s: 0.5\n  max_s: 1\nstop:\n  grace_s: 10\n"
BNB = "Failed to load CPU gemm_4bit_forward from kernels-community: No module named 'kernels'"




def test_a_frozen_trainer_is_a_hang_with_its_stacks_and_is_resumed(bed: Bed, tmp_path: Path) -> None:
    # SIGSTOP freezes train_network.py mid-run: no output, no exit, as a deadlock would. With a 5 s
    # floor the hang is found within seconds; py-spy reads the frozen process's stacks all the same.
    out = tmp_path / "out"
    frozen: list[int] = []

    def freeze_after_step_10(event: dict[str, Any]) -> None:
        if event["event"] == "state_saved" and event["step"] == 10 and not frozen:
            pid = trainsup_pid_of(out / ".trainsup")
            trainer = trainer_process(pid) if pid is not None else None
            assert trainer is not None, "no train_network.py process under trainsup"
            os.kill(trainer.pid, signal.SIGSTOP)
            frozen.append(trainer.pid)

    policy = POLICY + "hang:\n  min_timeout_s: 5\n"
    try:
        run = supervise(bed.command(out), out, tmp_path, env=bed.env(), policy=policy,
                        on_event=freeze_after_step_10, timeout=600, cwd=bed.sd_scripts)
    finally:
        for pid in frozen:  # never leave a frozen 4 GB trainer behind, whatever happened
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert run.returncode == 0, run.stderr[-3000:]
    assert frozen and [f["class"] for f in run.of("fault")] == ["hang"]
    evidence = run.of("fault")[0]["evidence"]
    assert "innermost frames: pid" in evidence and "(train_network.py:" in (run.run_dir / "hang-1.txt").read_text()
    start = run.of("attempt_start")[1]  # (then relaunched at the end of epoch 2: see docs/guides/resume.md)
    # the newest state at an epoch's end (8 steps an epoch), which trainsup keeps in its run dir
    assert (start["resume_from"], start["resume_step"]) == (str(run.run_dir / "saves" / "tiny-000001-state"), 8)
    assert run.of("finished")[0]["final_weights"] == str(out / "tiny.safetensors")
