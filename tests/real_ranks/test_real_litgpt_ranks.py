"""`trainsup run` over two real ranks of LitGPT: ``litgpt finetune_lora --devices 2`` on the CPU, on the bed of
``tests/real_litgpt`` (TRAINSUP_REALLITGPT=1; where CI is set, a tier that cannot run fails instead of
skipping). Lightning Fabric has no launcher program: the ``litgpt`` process trainsup starts is rank 0, and
it starts rank 1 as a child of its own (``LOCAL_RANK=1``); with ``--devices 2`` LitGPT's LoRA trains under
its ModelParallelStrategy (data parallel over gloo here), the ranks waiting on each other every step.

A rank killed -9 mid-run: the whole tree stopped within seconds (measured), the rank journaled, the run
started again (LitGPT's LoRA cannot resume) and ended as an uninterrupted two-rank run to the bit. A rank
stopped (SIGSTOP): a hang at the hang timeout whose report names it as the straggler, every rank's stacks in
the run dir, started again, ended the same.

What the bed could not run, and why (seen with litgpt 0.5.13, lightning 2.5 on this CPU):
- ``finetune_full --devices 2``: ``ValueError: You selected the FSDP strategy but FSDP is only available on
  GPU`` (LitGPT picks FSDP for more than one device), so the resumable method has no two-rank CPU run;
- a validation mid-run (``--eval.interval`` within the run): rank 0 alone generates an example from the
  sharded model while rank 1 waits in the barrier, and the run hangs there for good; the command here puts the
  interval past the run (the final validation, on both ranks, runs).

A two-rank run of 100 steps is ~12 s, ~7 s of it start-up. OMP_NUM_THREADS=1: two ranks on two cores."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.conftest import bare_ranks_run
from tests.e2e.demo_harness import SupervisedRun, supervise, visible_names
from tests.real_litgpt.bed import LitBed, build_bed
from tests.real_ranks.test_real_hf_ranks import AtStep

STEPS, SAVE_EVERY = 100, 25
# LitGPT's step line; the kill after the state of step 50, the stop after that of step 25
STEP_60 = "iter 60 step 60 |"
STEP_30 = "iter 30 step 30 |"
POLICY = "backoff:\n  initial_s: 0.5\n  max_s: 1\nstop:\n  grace_s: 10\n"


@pytest.fixture(scope="module")
def litgpt_bed() -> LitBed:
    found = build_bed()
    if isinstance(found, str):
        if os.environ.get("CI"):
            pytest.fail(f"CI is set and the real LitGPT ranks tier cannot run: {found}")
        pytest.skip(found)
    return found


def command(bed: LitBed, out: Path) -> list[str]:
    """The bed's LoRA command with two devices, 100 steps of 4 a rank (8 a step), a state every 25, the
    validation only at the end."""
    argv = bed.command("finetune_lora", out, "--devices", "2")
    for flag, value in (("--train.global_batch_size", "8"), ("--train.max_steps", str(STEPS)),
                        ("--train.save_interval", str(SAVE_EVERY)), ("--eval.interval", "1000")):
        at = argv.index(flag)
        argv[at + 1] = value
    return argv


def env(bed: LitBed) -> dict[str, str]:
    return bed.env(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


@pytest.fixture(scope="module")
def reference(litgpt_bed: LitBed, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("litgpt-ranks-reference") / "out"
    # rank 0 merges the LoRA into final/lit_model.pth last
    code, stderr = bare_ranks_run(command(litgpt_bed, out), None, env(litgpt_bed),
                                  lambda: (out / "final" / "lit_model.pth").is_file())
    assert code == 0, stderr[-3000:]
    return out


def assert_as_uninterrupted(bed: LitBed, out: Path, reference: Path) -> None:
    assert visible_names(out) == visible_names(reference)
    assert visible_names(reference) == ["final", "logs", *(f"step-{s:06d}" for s in range(25, STEPS + 1, 25))]
    for rel in ("final/lit_model.pth.lora", "final/lit_model.pth", f"step-{STEPS:06d}/lit_model.pth.lora"):
        assert bed.max_abs_diff(out / rel, reference / rel) == 0.0, rel


def supervised(bed: LitBed, out: Path, tmp: Path, policy: str, hook: AtStep) -> SupervisedRun:
    hook.start()
    run = supervise(command(bed, out), out, tmp, env=env(bed), policy=policy, timeout=600, cwd=tmp)
    hook.join(5)
    return run


def test_rank_1_killed_stops_the_whole_tree_within_seconds_and_the_run_ends_as_an_uninterrupted_one(
        litgpt_bed: LitBed, reference: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    kill = AtStep(out, signal.SIGKILL, STEP_60)
    run = supervised(litgpt_bed, out, tmp_path, POLICY, kill)
    kill.assert_kill_stopped_the_tree(run, "LitGPT", "litgpt")
    assert len(run.of("attempt_start")) == 2
    assert run.of("attempt_start")[1]["resume_step"] == 0  # LitGPT's LoRA starts again, out of sight
    assert_as_uninterrupted(litgpt_bed, out, reference)


def test_rank_1_stopped_is_a_hang_naming_it_the_straggler_then_the_run_ends_as_an_uninterrupted_one(
        litgpt_bed: LitBed, reference: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    stop = AtStep(out, signal.SIGSTOP, STEP_30)
    # 8 s without a step once training runs; start-up keeps its own long timeout (as tests/real_ranks' HF case)
    policy = "backoff:\n  initial_s: 0.5\n  max_s: 1\nstop:\n  grace_s: 3\nhang:\n  min_timeout_s: 8\n"
    run = supervised(litgpt_bed, out, tmp_path, policy, stop)
    stop.assert_hang_names_rank_1(run, "LitGPT", 2)  # both ranks, at least
    assert_as_uninterrupted(litgpt_bed, out, reference)


def test_a_rank_0_save_longer_than_the_groups_timeout_again_at_the_same_step_stops_the_run_saying_why(
        litgpt_bed: LitBed, tmp_path: Path) -> None:
    """LitGPT has no collective-timeout setting: after a timeout, one plain restart; the same timeout at the same
    step again stops the run with the reason, instead of identical restarts until the restart budget is spent.
    Rank 0's first LoRA checkpoint (step 25) takes 12 s more (``rank_faults``), longer than the group's timeout,
    4 s here (the shim stands in for torch's 10 or 30 minutes)."""
    out = tmp_path / "out"
    faults = Path(__file__).resolve().parent / "rank_faults"
    run = supervise(command(litgpt_bed, out), out, tmp_path, policy=POLICY, timeout=600, cwd=tmp_path,
                    env={**env(litgpt_bed), "PYTHONPATH": str(faults), "TRAINSUP_TEST_SLOW_SAVE_S": "12",
                         "TRAINSUP_TEST_PG_TIMEOUT_S": "4"})
    assert run.returncode == 4, run.stderr[-3000:]  # stopped: a restart cannot fix it
    assert [f["class"] for f in run.of("fault")] == ["nccl_timeout", "nccl_timeout"], run.of("fault")
    (remedy,) = run.of("remedy")
    assert remedy["actions"] == ["restart from the last safe state"], remedy  # nothing of LitGPT's to raise
    assert [e["step"] for e in run.of("attempt_end")] == [25, 25]
    (ended,) = run.of("gave_up")
    assert "timed out again at step 25 with the same settings" in ended["reason"], ended
    assert "timed out again at step 25" in run.stderr
