"""The deadline signal's decisions (run.deadline) and its policy keys, with a fake clock; the real
signal, requeue and exit codes are proven in tests/slurm and tests/e2e/test_deadline.py."""

from __future__ import annotations

import os
import signal
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from trainsup.record.journal import Journal, read_events
from trainsup.record.ledger import StateRecord
from trainsup.run.deadline import MARGIN_S, Deadline, requeues_without_progress
from trainsup.run.decide import Decision
from trainsup.run.policy import PolicyError, SlurmPolicy, parse_policy


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Points:
    def __init__(self, step: int | None) -> None:
        self.step = step

    def newest(self, nan_step: int | None = None, max_steps: int | None = None) -> StateRecord | None:
        return None if self.step is None else StateRecord(f"s{self.step}", self.step, 1, self.step)


def state(step: int) -> StateRecord:
    return StateRecord(f"s{step}", step, 1, step)


def make(tmp_path: Path, env: dict[str, str] | None = None, **policy: object) -> tuple[Deadline, Clock, Journal]:
    clock = Clock()
    return Deadline(SlurmPolicy(**policy), 5.0, clock, env or {}), clock, Journal(tmp_path)  # type: ignore[arg-type]


def stop(into: list[tuple[int, int]]) -> Callable[[int, int], None]:
    """The engine's request_stop(reason, trainer_signal), recorded."""
    return lambda reason, trainer_signal: into.append((reason, trainer_signal))


def test_policy_keys_parse_and_refuse_stop_signals() -> None:
    p = parse_policy("slurm:\n  deadline_signal: SIGUSR2\n  lead_s: 120\n  requeue: false\n"
                     "  requeue_budget: 1\n  exit_code_after_requeue: 0\n", "p.yaml")
    assert p.slurm == SlurmPolicy("USR2", 120.0, False, 1, 0)
    assert parse_policy("", "p.yaml").slurm == SlurmPolicy("USR1", 300.0, True, 3, None)
    with pytest.raises(PolicyError, match=r"p.yaml:2: slurm.deadline_signal: expected one of USR1"):
        parse_policy("slurm:\n  deadline_signal: TERM\n", "p.yaml")
    with pytest.raises(PolicyError, match=r"exit_code_after_requeue: expected null or an exit code 0..255"):
        parse_policy("slurm:\n  exit_code_after_requeue: 300\n", "p.yaml")


def test_waits_for_the_next_save_when_it_is_due_before_the_deadline(tmp_path: Path) -> None:
    d, clock, journal = make(tmp_path, lead_s=100)
    stops: list[tuple[int, int]] = []
    d.launched()
    clock.now += 30
    d.on_states([state(4)])
    clock.now += 20
    d.on_states([state(8)])
    d.on_states([state(8)])  # the epoch state of the same step: the same save
    assert d.interval == 30
    clock.now += 5
    d.signalled()
    d.tick(journal, lambda _m: None, stop(stops), None)
    assert not stops and d.wait_until == pytest.approx(clock.now + 100 - 5 - MARGIN_S)
    clock.now += 20
    d.tick(journal, lambda _m: None, stop(stops), None)
    assert not stops
    d.on_states([state(12)])
    d.tick(journal, lambda _m: None, stop(stops), None)
    assert stops == [(signal.SIGUSR1, signal.SIGTERM)]
    d.signalled()  # again: nothing more
    d.tick(journal, lambda _m: None, stop(stops), None)
    assert stops == [(signal.SIGUSR1, signal.SIGTERM)]
    assert [e["wait_for_save"] for e in read_events(tmp_path) if e["event"] == "deadline"] == [True]


def test_stops_now_when_no_save_can_be_complete_in_time_or_none_was_measured(tmp_path: Path) -> None:
    d, clock, journal = make(tmp_path, lead_s=60)
    stops: list[tuple[int, int]] = []
    d.signalled()  # nothing measured yet
    d.tick(journal, lambda _m: None, stop(stops), None)
    assert stops == [(signal.SIGUSR1, signal.SIGTERM)]
    d, clock, journal = make(tmp_path, lead_s=60)
    d.launched()
    clock.now += 50  # a save every 50 s; 60 - 5 grace - 10 margin leaves 45
    d.on_states([state(4)])
    d.signalled()
    d.tick(journal, lambda _m: None, stop(stops), None)
    assert stops == [(signal.SIGUSR1, signal.SIGTERM)] * 2


def test_the_save_not_coming_in_time_stops_at_the_latest_moment(tmp_path: Path) -> None:
    d, clock, journal = make(tmp_path, lead_s=100)
    stops: list[tuple[int, int]] = []
    d.launched()
    clock.now += 10
    d.on_states([state(4)])
    d.signalled()
    d.tick(journal, lambda _m: None, stop(stops), None)
    clock.now += 100 - 5 - MARGIN_S - 0.1
    d.tick(journal, lambda _m: None, stop(stops), None)
    assert not stops
    clock.now += 0.2
    d.tick(journal, lambda _m: None, stop(stops), None)
    assert stops == [(signal.SIGUSR1, signal.SIGTERM)]


def test_conclude_leaves_other_ends_alone_and_outside_slurm_never_requeues(tmp_path: Path) -> None:
    d, _clock, journal = make(tmp_path)
    term = Decision(kind="signal", exit_code=143, reason="stopped by SIGTERM")
    assert d.conclude(term, signal.SIGTERM, journal, Points(8), print) is term  # type: ignore[arg-type]
    usr1 = Decision(kind="signal", exit_code=138, reason="stopped by SIGUSR1")
    end = d.conclude(usr1, signal.SIGUSR1, journal, Points(8), print)  # type: ignore[arg-type]
    assert (end.kind, end.exit_code) == ("signal", 138) and "not in a Slurm job" in end.reason
    d, _clock, journal = make(tmp_path, exit_code_after_requeue=75)
    assert d.conclude(usr1, signal.SIGUSR1, journal, Points(8), print).exit_code == 75  # type: ignore[arg-type]


def fake_scontrol(tmp_path: Path, rc: int) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / "scontrol"
    tool.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'calls'}\necho 'scontrol: error: nope' >&2\nexit {rc}\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    return bin_dir


def test_requeue_and_its_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{fake_scontrol(tmp_path, 0)}{os.pathsep}{os.environ['PATH']}")
    usr1 = Decision(kind="signal", exit_code=138, reason="stopped by SIGUSR1")
    ends = []
    for step in (4, 4, 8, 8, 8):  # budget 2: two requeues without progress, then no more
        d, _clock, journal = make(tmp_path, {"SLURM_JOB_ID": "7"}, requeue_budget=2)
        ends.append(d.conclude(usr1, signal.SIGUSR1, journal, Points(step), print))  # type: ignore[arg-type]
        journal.close()
    assert [e.exit_code for e in ends] == [138, 138, 138, 138, 3]
    assert ends[-1].kind == "give_up" and "slurm.requeue_budget 2" in ends[-1].reason
    assert (tmp_path / "calls").read_text().splitlines() == ["requeue 7"] * 4
    assert requeues_without_progress(read_events(tmp_path), 8) == 2


def test_a_failed_requeue_is_said_and_the_stop_keeps_its_code(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{fake_scontrol(tmp_path, 1)}{os.pathsep}{os.environ['PATH']}")
    d, _clock, journal = make(tmp_path, {"SLURM_JOB_ID": "7"})
    said: list[str] = []
    end = d.conclude(Decision(kind="signal", exit_code=138), signal.SIGUSR1, journal, Points(None), said.append)  # type: ignore[arg-type]
    assert end.exit_code == 138 and "scontrol requeue 7 failed: exit 1: scontrol: error: nope" in end.reason
    assert said == ["error: scontrol requeue 7 failed: exit 1: scontrol: error: nope"]


def test_a_stop_already_asked_for_is_never_turned_into_a_deadline_stop(tmp_path: Path) -> None:
    d, _clock, journal = make(tmp_path)
    stops: list[tuple[int, int]] = []
    d.signalled()
    d.tick(journal, lambda _m: None, stop(stops), signal.SIGTERM)  # SIGTERM came first: it stays
    assert not stops and not read_events(tmp_path)


# --- a trainer whose stop saves a state (OneTrainer: SIGINT) --------------------------------------
def test_a_trainer_that_saves_on_stop_is_stopped_now_with_its_signal(tmp_path: Path) -> None:
    d, clock, journal = make(tmp_path, lead_s=300)  # grace 5 s
    stops: list[tuple[int, int]] = []
    d.launched(signal.SIGINT)
    clock.now += 60
    d.on_states([state(4)])  # a save every 60 s: the next one is due in 60 s, well before the deadline
    d.signalled()
    said: list[str] = []
    d.tick(journal, said.append, stop(stops), None)
    assert stops == [(signal.SIGUSR1, signal.SIGINT)] and d.wait_until is None
    (event,) = [e for e in read_events(tmp_path) if e["event"] == "deadline"]
    assert (event["choice"], event["wait_for_save"], event["save_signal"], event["next_save_in_s"]) == \
        ("save_on_stop", False, "SIGINT", 60.0)
    assert said == [("SIGUSR1: the job ends in 300 s; stopping now with SIGINT: the trainer saves a state first, "
                     "and that state is the resume point")]


def test_the_save_signal_is_used_when_no_save_was_measured_or_none_fits(tmp_path: Path) -> None:
    for measured in (False, True):
        (tmp_path / str(measured)).mkdir()
        d, clock, journal = make(tmp_path / str(measured), lead_s=60)
        stops: list[tuple[int, int]] = []
        d.launched(signal.SIGINT)
        if measured:
            clock.now += 100  # saves 100 s apart: none can come in the 60 s left
            d.on_states([state(4)])
        d.signalled()
        d.tick(journal, lambda _m: None, stop(stops), None)
        assert stops == [(signal.SIGUSR1, signal.SIGINT)]
        assert [e["choice"] for e in read_events(tmp_path / str(measured)) if e["event"] == "deadline"] == \
            ["save_on_stop"]


def test_a_periodic_save_due_within_the_stop_grace_is_waited_for_and_then_sigterm(tmp_path: Path) -> None:
    d, clock, journal = make(tmp_path, lead_s=300)  # grace 5 s: the stop's own save may take that long
    stops: list[tuple[int, int]] = []
    d.launched(signal.SIGINT)
    clock.now += 20
    d.on_states([state(4)])
    clock.now += 16  # the next save is due in 4 s, sooner than the stop's save can be counted on
    d.signalled()
    d.tick(journal, lambda _m: None, stop(stops), None)
    assert not stops and d.wait_until is not None
    (event,) = [e for e in read_events(tmp_path) if e["event"] == "deadline"]
    assert (event["choice"], event["wait_for_save"]) == ("wait_for_save", True)
    clock.now += 4
    d.on_states([state(8)])
    d.tick(journal, lambda _m: None, stop(stops), None)
    assert stops == [(signal.SIGUSR1, signal.SIGTERM)]  # the state is written: no second save


def test_a_periodic_save_that_does_not_come_in_time_is_replaced_by_the_stop_save(tmp_path: Path) -> None:
    d, clock, journal = make(tmp_path, lead_s=100)
    stops: list[tuple[int, int]] = []
    d.launched(signal.SIGINT)
    clock.now += 20
    d.on_states([state(4)])
    clock.now += 18
    d.signalled()
    said: list[str] = []
    d.tick(journal, said.append, stop(stops), None)
    assert not stops
    clock.now = d.wait_until + 0.1  # type: ignore[operator]
    d.tick(journal, said.append, stop(stops), None)
    assert stops == [(signal.SIGUSR1, signal.SIGINT)]
    assert said[-1] == "SIGUSR1: the save did not come in time: stopping now with SIGINT"


def test_an_adapter_stopping_with_sigterm_keeps_the_plain_choice(tmp_path: Path) -> None:
    d, clock, journal = make(tmp_path, lead_s=300)
    stops: list[tuple[int, int]] = []
    d.launched(signal.SIGTERM)
    clock.now += 60
    d.on_states([state(4)])
    d.signalled()
    d.tick(journal, lambda _m: None, stop(stops), None)
    assert not stops  # the save due in 60 s fits: wait for it, as before
    (event,) = [e for e in read_events(tmp_path) if e["event"] == "deadline"]
    assert (event["choice"], event["save_signal"]) == ("wait_for_save", None)
