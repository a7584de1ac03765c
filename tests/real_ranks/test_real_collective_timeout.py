"""A collective timeout from a rank-0-only phase, on two real ranks (issue 34): TRL's ``sft.py`` under
``torchrun --nproc_per_node 2`` with gloo on the CPU, ``--ddp_timeout 5``. Rank 0 alone sleeps at the start
of each checkpoint save (``rank_faults/sitecustomize.py``, on PYTHONPATH: the save is work only rank 0 is late
in, as a big checkpoint, a sample or a validation pass would be); rank 1 goes on into the next collective and
gloo gives up after 5 s (``Timed out waiting 5000ms for send operation to complete``, in its all_gather).
trainsup must read that as ``nccl_timeout``, relaunch with ``--ddp_timeout`` raised (20 s: longer than the save)
rather than an identical restart, and finish.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.e2e.demo_harness import supervise
from tests.real_hf.bed import HfBed, processes_of

SHIM = Path(__file__).parent / "rank_faults"
STEPS, SAVE_EVERY, SLOW_SAVE_S, TIMEOUT_S = 40, 20, 12, 5


def command(bed: HfBed, out: Path) -> list[str]:
    r = bed.root
    sft = next((r / "venv" / "lib").glob("python3*/site-packages/trl/scripts/sft.py"))
    return [str(r / "venv" / "bin" / "torchrun"), "--nproc_per_node", "2", str(sft),
            "--model_name_or_path", str(r / "model" / "tiny-llama"), "--dataset_name", str(r / "data" / "chat"),
            "--output_dir", str(out), "--max_steps", str(STEPS), "--save_steps", str(SAVE_EVERY),
            "--logging_steps", "1", "--per_device_train_batch_size", "8", "--bf16", "false", "--ddp_backend", "gloo",
            "--use_cpu", "true", "--ddp_timeout", str(TIMEOUT_S)]


def test_a_rank_0_save_longer_than_the_collective_timeout_is_fixed_by_a_longer_ddp_timeout(
        hf_bed: HfBed, tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = hf_bed.env(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=str(SHIM),
                     TRAINSUP_TEST_SLOW_SAVE_S=str(SLOW_SAVE_S))
    policy = "backoff:\n  initial_s: 0.5\n  max_s: 1\nstop:\n  grace_s: 5\n"
    run = supervise(command(hf_bed, out), out, tmp_path, env=env, policy=policy, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    (fault,) = run.of("fault")
    assert fault["class"] == "nccl_timeout", fault
    assert "Timed out waiting 5000ms" in fault["evidence"]
    (remedy,) = run.of("remedy")
    assert any(a.startswith("--ddp_timeout 20 (was 5)") for a in remedy["actions"]), remedy
    starts = run.of("attempt_start")
    ends = run.of("attempt_end")
    print(f"attempt 1 (--ddp_timeout {TIMEOUT_S}) launch -> its end on nccl_timeout: "
          f"{ends[0]['ts'] - starts[0]['ts']:.1f} s; attempt 2 (--ddp_timeout 20) launch -> finished: "
          f"{ends[-1]['ts'] - starts[-1]['ts']:.1f} s")
    first, second = (s["argv"] for s in starts)
    assert first[first.index("--ddp_timeout") + 1] == "5" and second[second.index("--ddp_timeout") + 1] == "20"
    state = json.loads((out / f"checkpoint-{STEPS}" / "trainer_state.json").read_text())
    assert state["global_step"] == STEPS
    assert (out / "model.safetensors").is_file()
    assert not processes_of(out), "a process still names the output dir"
