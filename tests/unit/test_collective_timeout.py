"""Collective timeouts (issue 34): recognised in each backend's real wording, and answered by the trainer's
timeout setting, not an identical restart (a rank busy in work only it does outlasts the group's timeout
again after a restart)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_hf_adapter import trl
from tests.unit.test_musubi_adapter import _argv as musubi_argv
from trainsup.adapters.hf.adapter import FAMILY as HF
from trainsup.adapters.kohya.adapter import KohyaRun
from trainsup.adapters.musubi.adapter import MusubiRun
from trainsup.faults.remedies import DEFAULT, collective_timeout_s, raised_timeout_s
from trainsup.faults.scanner import classify_text
from trainsup.faults.verdict import Said
from trainsup.run.decide import History, Outcome, decide, record
from trainsup.run.policy import parse_policy
from trainsup.trainers.base import Setup, rung_applies

GLOO = ("[rank1]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:129] "
        "Timed out waiting 5000ms for send operation to complete")
WATCHDOG = ("[rank1]:[E1126 10:02:11.120934511 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective operation "
            "timeout: WorkNCCL(SeqNum=381, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
            "600055 milliseconds before timing out.")


@pytest.mark.parametrize("line, fault", [
    (GLOO, "nccl_timeout"),
    (("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Timed out waiting 1800000ms for recv "
     "operation to complete"), "nccl_timeout"),
    ("RuntimeError: [/opt/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:445] Timed out", "nccl_timeout"),
    (WATCHDOG, "nccl_timeout"),
    (("torch.distributed.DistBackendError: [2] is setting up NCCL communicator and retrieving ncclUniqueId from [0] "
     "via c10d key-value store by key '0', but store->get('0') got error: wait timeout"), "nccl_error"),
    (("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer "
     "[10.0.0.3]:38011"), "nccl_error"),
])
def test_each_backends_collective_wording_is_recognised(line: str, fault: str) -> None:
    found = classify_text([line])
    assert found is not None and found.fault == fault


def test_the_timeout_the_group_had_is_read_from_the_evidence() -> None:
    gloo, watchdog = classify_text([GLOO]), classify_text([WATCHDOG])
    assert gloo is not None and watchdog is not None
    assert collective_timeout_s(gloo.said) == 5 and collective_timeout_s(watchdog.said) == 600
    assert collective_timeout_s(Said(WATCHDOG)) == 600  # text alone (a journal's), read again
    assert raised_timeout_s(None, 1800, watchdog.said, 4) == 2400  # the group's own, not the default
    assert raised_timeout_s(900, 1800, watchdog.said, 4) == 3600  # the command's, when it is above
    assert raised_timeout_s(None, 1800, Said(None), 4) == 7200


def test_the_neutral_ladder_raises_the_timeout_before_any_identical_restart() -> None:
    first, then = DEFAULT["nccl_timeout"]
    assert [a.kind for a in first.actions] == ["raise_timeout"] and first.repeat and then.repeat


def _timed_out(attempt: int, step: int) -> Outcome:
    return Outcome(attempt=attempt, exit_code=1, signal=None, child_status=None, child_signal=None, uptime_s=900.0,
                   fault="nccl_timeout", evidence=GLOO, evidence_line=3, steps_trained=step, step=step,
                   saved_new_state=False, ended_at=float(attempt))


def test_a_timeout_again_at_the_same_step_stops_a_trainer_without_a_timeout_setting_and_raises_one_with_it() -> None:
    """Without the setting (the raise does not apply): one plain restart, then a stop at the same step, saying
    why, instead of identical restarts until the budget is spent. With it: raised again at each recurrence."""
    policy = parse_policy("", "p")
    history = History()
    first = decide(history, _timed_out(1, 40), policy, 10, lambda rung: rung.actions[0].kind != "raise_timeout")
    assert first.kind == "restart" and first.rung is not None and first.rung.actions[0].kind == "restart"
    record(history, _timed_out(1, 40), first, 10)
    elsewhere = decide(history, _timed_out(2, 80), policy, 20, lambda rung: rung.actions[0].kind != "raise_timeout")
    assert elsewhere.kind == "restart"  # another step: another phase, maybe a passing one
    again = decide(history, _timed_out(2, 40), policy, 20, lambda rung: rung.actions[0].kind != "raise_timeout")
    assert again.kind == "stop" and "timed out again at step 40 with the same settings" in again.reason
    assert "no timeout setting" in again.reason
    history = History()
    for attempt in (1, 2, 3):
        raised = decide(history, _timed_out(attempt, 40), policy, 10 * attempt, lambda rung: True)
        assert raised.kind == "restart" and raised.rung is not None
        assert [a.kind for a in raised.rung.actions] == ["raise_timeout"], attempt
        record(history, _timed_out(attempt, 40), raised, 10 * attempt)


def test_the_hf_trainer_gets_ddp_timeout_in_seconds_raised_from_the_command_or_the_groups(tmp_path: Path) -> None:
    run = HF.open(Setup(trl(tmp_path / "out", "--ddp_timeout", "5"), tmp_path))
    gloo = classify_text([GLOO])
    assert gloo is not None
    rung = run.ladder("nccl_timeout")[0]
    assert rung_applies(run, run.plan, rung, gloo.said)
    plan = run.plan.copy()
    said = run.apply(plan, rung.actions[0], gloo.said)
    assert said is not None and said.startswith("--ddp_timeout 20 (was 5)")
    assert run.command_line(plan)[-2:] == ["--ddp_timeout", "20"]
    bare = HF.open(Setup(trl(tmp_path / "out"), tmp_path))
    plan = bare.plan.copy()
    watchdog = classify_text([WATCHDOG])
    assert watchdog is not None
    assert bare.apply(plan, rung.actions[0], watchdog.said) is not None
    assert bare.command_line(plan)[-2:] == ["--ddp_timeout", "2400"]


def test_sd_scripts_and_musubi_get_ddp_timeout_in_minutes(tmp_path: Path) -> None:
    watchdog = classify_text([WATCHDOG])
    assert watchdog is not None
    kohya = KohyaRun(Setup(("accelerate", "launch", "--num_processes", "2", "train_network.py", "--output_dir",
                            str(tmp_path / "out"), "--output_name", "x", "--ddp_timeout", "10"), tmp_path))
    rung = kohya.ladder("nccl_timeout")[0]
    plan = kohya.plan.copy()
    assert kohya.apply(plan, rung.actions[0], watchdog.said) == \
        "--ddp_timeout 40 (was 10): a rank was busy longer than the collective timeout"
    musubi = MusubiRun(Setup(musubi_argv(tmp_path), tmp_path))
    plan = musubi.plan.copy()
    assert musubi.apply(plan, musubi.ladder("nccl_timeout")[0].actions[0], watchdog.said) is not None
    assert "--ddp_timeout" in musubi.command_line(plan)
    argv = musubi.command_line(plan)
    assert argv[argv.index("--ddp_timeout") + 1] == "40"  # the group's 10 minutes, times 4


def test_a_collective_failure_gives_way_to_the_rank_that_failed_before_it() -> None:
    first = ["[rank1]: Traceback (most recent call last):",
             '[rank1]:   File "/w/train.py", line 80, in step',
             "[rank1]:     batch = next(it)",
             "[rank1]: KeyError: 'latents'"]
    found = classify_text([*first, WATCHDOG])
    assert found is not None and found.fault == "unknown" and "KeyError" in found.line
    found = classify_text([*first[:-1], "[rank1]: torch.OutOfMemoryError: CUDA out of memory.", GLOO])
    assert found is not None and found.fault == "cuda_oom"
    # alone, or after a failure that was its own consequence, the timeout is the verdict
    found = classify_text(["{'loss': 1.2, 'epoch': 0.5}", WATCHDOG])
    assert found is not None and found.fault == "nccl_timeout"
