"""The hang clock against a fixed clock, the stacks report, the hang's spot and its policy keys."""

from __future__ import annotations

import pytest

from trainsup.run.decide import History, Outcome, decide, record
from trainsup.run.policy import PolicyError, parse_policy
from trainsup.sensors.hang import HangClock, HangPolicy, hang_evidence, hang_spot, percentile
from trainsup.sensors.stacks import collective_of, innermost_main_frame

POLICY = HangPolicy(startup_timeout_s=1800, min_timeout_s=300, step_factor=10, phase_timeout_s=1800)


def test_before_the_first_step_the_startup_timeout_applies() -> None:
    clock = HangClock(POLICY, now=0)
    assert clock.overdue(1799) is None and clock.overdue(1801) == 1801
    clock.on_step(0, 100)  # the 0/N bar drawn at the start is not a trained step
    assert clock.phase == "startup" and clock.timeout() == 1800


def test_training_timeout_adapts_to_observed_step_times_with_a_floor() -> None:
    clock = HangClock(POLICY, now=0)
    for step in range(1, 101):
        clock.on_step(step, 100 + step * 2.0)  # 2 s a step
    assert clock.phase == "training" and clock.timeout() == 300  # 10 x 2 s is under the floor
    slow, now = HangClock(POLICY, now=0), 0.0
    for step in range(1, 101):
        now += 60.0 if step % 10 == 0 else 40.0  # one step in ten is slow
        slow.on_step(step, now)
    assert slow.timeout() == 10 * 60.0  # the 95th percentile of the step times, times the factor
    assert percentile([1, 2, 3, 4, 100], 0.95) == 100


def test_a_redraw_of_the_same_step_is_not_progress() -> None:
    clock = HangClock(POLICY, now=0)
    clock.on_step(1, 10)
    clock.on_step(2, 12)
    clock.on_step(2, 400)  # the postfix of step 2 redrawn, or the bar closing: no progress
    assert clock.last_progress == 12 and clock.overdue(313) == 301


def test_sampling_gets_the_phase_timeout_renewed_by_its_lines_and_a_new_step_ends_it() -> None:
    clock = HangClock(POLICY, now=0)
    for step in range(1, 11):
        clock.on_step(step, float(step))
    clock.enter("sampling", 20, "generating sample images at step 10")
    assert clock.timeout() == 1800 and clock.overdue(1000) is None
    clock.on_activity(1500, "100%|##| 30/30")  # the sampling bar moved
    assert clock.overdue(3000) is None and clock.overdue(3301) is not None
    clock.on_step(11, 3302)
    assert clock.phase == "training" and clock.timeout() == 300


def test_one_fixed_timeout_for_every_phase() -> None:
    clock = HangClock(HangPolicy(timeout_s=42), now=0)
    assert clock.timeout() == 42
    clock.enter("saving", 1)
    assert clock.timeout() == 42 and clock.overdue(44) == 43


def test_the_innermost_frame_of_the_main_thread_is_read_from_py_spy() -> None:
    named = ('Process 7: python train_network.py\nPython v3.11.7 (/usr/bin/python3.11)\n\n'
             'Thread 0x7F3A (idle): "MainThread"\n    wait (threading.py:327)\n    get (queue.py:180)\n'
             '    _try_get_data (torch/utils/data/dataloader.py:1133)\n'
             'Thread 0x7F3B (idle): "pin_memory"\n    select (selectors.py:415)\n')
    assert innermost_main_frame(named) == "wait (threading.py:327)"
    unnamed = "Thread 13604 (idle)\n    blocked_forever (<string>:4)\n    <module> (<string>:5)\n"
    assert innermost_main_frame(unnamed) == "blocked_forever (<string>:4)"
    assert innermost_main_frame("py-spy failed: Permission denied") is None


def test_a_hang_that_recurs_at_the_same_spot_stops_at_once() -> None:
    clock = HangClock(POLICY, now=0)
    clock.on_step(1, 1)
    text = hang_evidence(400, clock, 812, ["pid 9 wait (threading.py:327)"], dataloader=True)
    assert hang_spot(text) == "at step 812, pid 9 wait (threading.py:327)"
    assert "DataLoader waits" in text
    history = History()

    def outcome(n: int, evidence: str) -> Outcome:
        return Outcome(attempt=n, exit_code=None, signal=9, child_status=None, child_signal=None, uptime_s=500.0,
                       fault="hang", evidence=evidence, evidence_line=None, steps_trained=10, saved_new_state=True,
                       ended_at=float(n))

    first = decide(history, outcome(1, text), parse_policy("", "p"), 10, lambda rung: True)
    assert first.kind == "restart"
    record(history, outcome(1, text), first, 10)
    other = text.replace("at step 812", "at step 900")
    assert decide(history, outcome(2, other), parse_policy("", "p"), 20, lambda rung: True).kind == "restart"
    again = decide(history, outcome(2, text), parse_policy("", "p"), 20, lambda rung: True)
    assert again.kind == "stop" and "hung again at step 812" in again.reason


def test_hang_policy_keys_are_validated() -> None:
    policy = parse_policy("hang:\n  min_timeout_s: 5\n  timeout_s: null\n", "p.yaml")
    assert policy.hang.min_timeout_s == 5 and policy.hang.timeout_s is None
    with pytest.raises(PolicyError, match=r"p.yaml:2: hang.step_factor: expected a number >= 1, got 'ten'"):
        parse_policy("hang:\n  step_factor: ten\n", "p.yaml")


def test_the_output_parser_notes_progress_besides_the_steps_bar_and_nothing_else() -> None:
    from trainsup.adapters.kohya.output import KohyaOutput
    from trainsup.faults.scanner import FaultScanner
    from trainsup.run.events import PhaseEntered, new_queue
    from trainsup.run.observe import OutputParser

    now = [0.0]
    events = new_queue()
    parser = OutputParser(events, FaultScanner(), clock=lambda: now[0], fmt=KohyaOutput())

    def feed(text: str, at: float) -> None:
        now[0] = at
        parser.feed("stderr", text.encode())

    bar = "\rsteps:  50%|#####     | {n}/20 [00:10<00:10,  1.00it/s, avr_loss=0.1]"
    feed(bar.format(n=10), 1)
    feed("\n[rank0]:[W] ProcessGroupNCCL.cpp:1 Watchdog: still waiting\n", 60)  # not progress
    assert parser.activity_at is None
    feed("caching latents:  50%|#####     | 4/8 [00:01<00:01,  4.00it/s]\r", 61)
    assert parser.activity_at == 61
    feed("2024-08-01 12:00:00 INFO     generating sample images at step / サンプル画像生成 ステップ: 10\n", 62)
    posted = [events.get() for _ in range(events.qsize())]
    assert PhaseEntered("sampling", "generating sample images at step / サンプル画像生成 ステップ: 10") in posted
    feed("INFO     prompt: a red fox\n", 70)  # a line of the sampling pass: it is at work
    assert parser.activity_at == 70
    feed(bar.format(n=11) + "\n", 80)  # a new step: the phase is over
    feed("[rank0]:[W] ProcessGroupNCCL.cpp:1 Watchdog: still waiting\n", 140)
    assert parser.activity_at == 80


def test_a_completed_state_ends_the_saving_phase() -> None:
    from trainsup.adapters.kohya.output import KohyaOutput
    from trainsup.faults.scanner import FaultScanner
    from trainsup.run.events import PhaseEntered, new_queue
    from trainsup.run.observe import OutputParser

    events = new_queue()
    parser = OutputParser(events, FaultScanner(), clock=lambda: 5.0, fmt=KohyaOutput())
    parser.feed("stdout", b"saving checkpoint: /out/tiny-step00000010.safetensors\n"
                          b"INFO     saving state at step 10\n"
                          b"INFO     Random states saved in /out/tiny-step00000010-state/random_states_0.pkl\n")
    phases = [e.phase for e in (events.get() for _ in range(events.qsize())) if isinstance(e, PhaseEntered)]
    assert phases == ["saving", "saving", "training"]
    clock = HangClock(POLICY, now=0)
    for step in range(1, 11):
        clock.on_step(step, float(step))
    clock.enter("saving", 11)
    clock.enter("training", 12)
    assert clock.timeout() == 300  # a trainer frozen right after its save is found at the training timeout


def test_a_rank_waits_in_a_collective_of_torch_distributed_or_of_ddp_itself() -> None:
    def dump(*frames: str) -> str:
        return 'Thread 9 (idle): "MainThread"\n' + "".join(f"    {f}\n" for f in frames)

    assert collective_of(dump("all_gather (torch/distributed/distributed_c10d.py:3802)",
                              "wrapper (torch/distributed/c10d_logger.py:81)")) == "all_gather"
    # DDP's own sync before a forward (seen: sd-scripts' rank 0 waiting for a stopped rank 1)
    assert collective_of(dump("DistributedDataParallel._pre_forward (torch/nn/parallel/distributed.py:1775)",
                              "DistributedDataParallel.forward (torch/nn/parallel/distributed.py:1840)",
                              "train (train_textual_inversion.py:602)")) == "DistributedDataParallel._pre_forward"
    # ... or in the gradients' all-reduce that DDP runs from the backward's hooks (seen: the same rank 0)
    assert collective_of(dump("_engine_run_backward (torch/autograd/graph.py:979)",
                              "backward (torch/autograd/__init__.py:353)",
                              "train (train_textual_inversion.py:640)")) == \
        "the backward's gradient all-reduce (_engine_run_backward)"
    assert collective_of(dump("forward (model.py:10)", "train (train.py:5)")) is None


def test_after_the_last_step_the_finishing_phase_gets_the_phase_timeout() -> None:
    """The final weights, a last evaluation and the ranks' teardown print nothing for a while: past the last
    step the training timeout (a few steps' time) no longer applies."""
    clock = HangClock(POLICY, now=0)
    for step in range(1, 11):
        clock.on_step(step, float(step), total=20)
    assert clock.phase == "training" and clock.timeout() == 300
    clock.on_step(20, 20.0, total=20)
    assert clock.phase == "finishing" and clock.timeout() == POLICY.phase_timeout_s
    assert clock.overdue(20.0 + 1000) is None and clock.overdue(20.0 + 1801) is not None
