"""The deadline signal's decisions (run.deadline) and its policy keys, with a fake clock; the real
signal, requeue and exit codes are proven in tests/slurm and tests/e2e/test_deadline.py."""

from __future__ import annotations

import os
import signal
import stat
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
    stops: list[int] = []
    d.launched()
    clock.now += 30
    d.on_states([state(4)])
    clock.now += 20
    d.on_states([state(8)])
    d.on_states([state(8)])  # the epoch state of the same step: the same save
    assert d.interval == 30
    clock.now += 5
    d.signalled()
    d.tick(journal, lambda _m: None, stops.append, None)
    assert not stops and d.wait_until == pytest.approx(clock.now + 100 - 5 - MARGIN_S)
    clock.now += 20
    d.tick(journal, lambda _m: None, stops.append, None)
    assert not stops
    d.on_states([state(12)])
    d.tick(journal, lambda _m: None, stops.append, None)
    assert stops == [signal.SIGUSR1]
    d.signalled()  # again: nothing more
    d.tick(journal, lambda _m: None, stops.append, None)
    assert stops == [signal.SIGUSR1]
    assert [e["wait_for_save"] for e in read_events(tmp_path) if e["event"] == "deadline"] == [True]


def test_stops_now_when_no_save_can_be_complete_in_time_or_none_was_measured(tmp_path: Path) -> None:
    d, clock, journal = make(tmp_path, lead_s=60)
    stops: list[int] = []
    d.signalled()  # nothing measured yet
    d.tick(journal, lambda _m: None, stops.append, None)
    assert stops == [signal.SIGUSR1]
    d, clock, journal = make(tmp_path, lead_s=60)
    d.launched()
    clock.now += 50  # a save every 50 s; 60 - 5 grace - 10 margin leaves 45
    d.on_states([state(4)])
    d.signalled()
    d.tick(journal, lambda _m: None, stops.append, None)
    assert stops == [signal.SIGUSR1] * 2


def test_the_save_not_coming_in_time_stops_at_the_latest_moment(tmp_path: Path) -> None:
    d, clock, journal = make(tmp_path, lead_s=100)
    stops: list[int] = []
    d.launched()
    clock.now += 10
    d.on_states([state(4)])
    d.signalled()
    d.tick(journal, lambda _m: None, stops.append, None)
    clock.now += 100 - 5 - MARGIN_S - 0.1
    d.tick(journal, lambda _m: None, stops.append, None)
    assert not stops
    clock.now += 0.2
    d.tick(journal, lambda _m: None, stops.append, None)
    assert stops == [signal.SIGUSR1]


def test_conclude_leaves_other_ends_alone_and_outside_slurm_never_requeues(tmp_path: Path) -> None:
    d, _clock, journal = make(tmp_path)
    term = Decision("signal", 143, "stopped by SIGTERM")
    assert d.conclude(term, signal.SIGTERM, journal, Points(8), print) is term  # type: ignore[arg-type]
    usr1 = Decision("signal", 138, "stopped by SIGUSR1")
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
    usr1 = Decision("signal", 138, "stopped by SIGUSR1")
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
    end = d.conclude(Decision("signal", 138, ""), signal.SIGUSR1, journal, Points(None), said.append)  # type: ignore[arg-type]
    assert end.exit_code == 138 and "scontrol requeue 7 failed: exit 1: scontrol: error: nope" in end.reason
    assert said == ["error: scontrol requeue 7 failed: exit 1: scontrol: error: nope"]


def test_a_stop_already_asked_for_is_never_turned_into_a_deadline_stop(tmp_path: Path) -> None:
    d, _clock, journal = make(tmp_path)
    stops: list[int] = []
    d.signalled()
    d.tick(journal, lambda _m: None, stops.append, signal.SIGTERM)  # SIGTERM came first: it stays
    assert not stops and not read_events(tmp_path)
