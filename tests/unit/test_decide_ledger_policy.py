"""The pure decision, the step ledger's arithmetic, and policy validation."""

from dataclasses import replace
from pathlib import Path

import pytest

from trainsup.adapters.kohya.exact import label_offset, trains_past
from trainsup.adapters.kohya.remedies import ladder as kohya_ladder
from trainsup.faults.remedies import RESTART, Rung
from trainsup.run.decide import History, Outcome, decide, record
from trainsup.run.policy import Policy, PolicyError, parse_policy
from trainsup.sensors.oomkills import killed_for_memory, oom_kills


def outcome(fault: str | None, uptime: float = 100.0, steps: int = 5, new_state: bool = False,
            attempt: int = 1) -> Outcome:
    return Outcome(attempt=attempt, exit_code=1, signal=None, child_status=None, child_signal=None, uptime_s=uptime,
                   fault=fault, evidence="evidence", evidence_line=3, steps_trained=steps, saved_new_state=new_state,
                   ended_at=0.0)


def always(_: Rung) -> bool:
    return True


def test_clean_outcome_finishes_and_config_errors_stop_at_once() -> None:
    assert decide(History(), outcome(None), Policy(), 0, always).kind == "finish"
    d = decide(History(), outcome("config_error"), Policy(), 0, always)
    assert (d.kind, d.exit_code) == ("stop", 4)


def test_ladder_climbs_when_the_same_fault_recurs_and_skips_rungs_that_do_nothing() -> None:
    h = History()
    # (kohya's ladder: the trainer-neutral default has no rung for a device mismatch, see below)
    d1 = decide(h, outcome("device_mismatch"), Policy(), 0, always, ladder=kohya_ladder)
    assert d1.kind == "restart" and d1.rung_index == 0
    record(h, outcome("device_mismatch"), d1, 0)
    d2 = decide(h, outcome("device_mismatch"), Policy(), 1, lambda r: "cache_text" not in r.describe(),
                ladder=kohya_ladder)
    assert d2.kind == "stop" and d2.exit_code == 4  # rung 1 would change nothing: straight to stop


def test_the_neutral_default_ladder_names_no_trainers_flag_and_stops_what_a_restart_cannot_fix() -> None:
    from trainsup.faults.remedies import DEFAULT

    for fault, rungs in DEFAULT.items():
        for rung in rungs:
            assert all(a.kind not in ("add_flag", "remove_flag") for a in rung.actions), fault
            assert "--" not in rung.describe(), (fault, rung.describe())
    d = decide(History(), outcome("device_mismatch"), Policy(), 0, always)
    assert d.kind == "stop" and "--" not in d.reason


def test_backoff_grows_and_resets_after_a_new_state() -> None:
    pol = Policy(backoff_initial_s=2, backoff_max_s=5, backoff_factor=2, restart_max=10)
    h = History()
    delays = []
    for i in range(4):
        d = decide(h, outcome("unknown"), pol, i, always)
        delays.append(d.delay_s)
        record(h, outcome("unknown"), d, i)
    assert delays == [2, 4, 5, 5]
    assert decide(h, outcome("unknown", new_state=True), pol, 5, always).delay_s == 2


def test_restart_budget_is_counted_in_the_window() -> None:
    pol = Policy(restart_max=2, restart_window_s=60)
    h = History(restarts_at=[0.0, 10.0])
    assert decide(h, outcome("unknown"), pol, 20, always).kind == "give_up"
    assert decide(h, outcome("unknown"), pol, 65, always).kind == "restart"


def test_kohya_label_offset_after_resume() -> None:
    # 4 batches per epoch, resumed at step 10: kohya skips 2 epochs and labels the next step 3.
    assert label_offset(10, True, 4) == 8
    assert label_offset(8, True, 4) == 8
    assert label_offset(3, True, 4) == 0
    assert label_offset(10, False, 4) == 10  # without skipping, the global step restarts at 0
    assert label_offset(0, True, 4) == 0


def test_policy_values_and_errors() -> None:
    pol = parse_policy("restart:\n  max: 2\nbackoff:\n  initial_s: 0.5\nsave:\n  every_n_steps: 7\n", "p.yaml")
    assert (pol.restart_max, pol.backoff_initial_s, pol.save_every_n_steps) == (2, 0.5, 7)
    with pytest.raises(PolicyError, match=r"p.yaml:4: backoff.initail_s: unknown key"):
        parse_policy("restart:\n  max: 2\nbackoff:\n  initail_s: 1\n", "p.yaml")
    with pytest.raises(PolicyError, match=r"p.yaml:1: unknown section 'retsart'"):
        parse_policy("retsart: {}\n", "p.yaml")
    with pytest.raises(PolicyError, match=r"environment.allow_upgrade: expected true or false, got 'yes please'"):
        parse_policy("environment:\n  allow_upgrade: yes please\n", "p.yaml")


def test_example_config_is_a_valid_project_whose_policy_shows_the_defaults() -> None:
    from trainsup.run.project import load_project

    root = Path(__file__).resolve().parents[2]
    project = load_project(root / "config.example.yaml")
    assert project.command[:3] == ("accelerate", "launch", "train_network.py")
    assert project.env["CUDA_VISIBLE_DEVICES"] == "0" and project.cwd == Path("/srv/sd-scripts")
    assert project.policy == Policy(source=str(root / "config.example.yaml"))  # every value shown is the default


def test_kohya_overshoot_after_resume_is_predicted() -> None:
    def overshoot(resume: int, max_steps: int, per_epoch: int) -> int:
        return trains_past(label_offset(resume, True, per_epoch), max_steps, per_epoch)

    assert overshoot(8, 18, 4) == 2  # 5 epochs of 4 = 20 steps, its stop never fires
    assert overshoot(8, 20, 4) == 0  # whole epochs: nothing extra
    assert overshoot(3, 18, 4) == 0  # resumed inside the first epoch: labels are right


def test_a_user_rule_that_says_restartable_false_stops_at_once() -> None:
    from trainsup.faults.scanner import load_user_rules
    from trainsup.run.decide import stops_at_once

    rules = load_user_rules([{"id": "license_expired", "patterns": ["License expired"], "restartable": False}],
                            "p.yaml")
    d = decide(History(), outcome("license_expired"), Policy(), 0, always, stops_at_once(rules))
    assert (d.kind, d.exit_code) == ("stop", 4) and "restart cannot fix" in d.reason
    assert decide(History(), outcome("license_expired"), Policy(), 0, always).kind == "restart"


def test_a_sigkill_that_was_not_the_oom_killers_restarts_unchanged_and_keeps_the_ladder(tmp_path: Path) -> None:
    history, policy = History(), Policy()
    killed = replace(outcome("host_oom_killed"), same_settings=True)
    d = decide(history, killed, policy, 0.0, lambda rung: True)
    assert d.kind == "restart" and d.rung is RESTART
    record(history, killed, d, 0.0)
    real_oom = decide(history, outcome("host_oom_killed", attempt=2), policy, 1.0, lambda rung: True)
    assert real_oom.rung is not None and real_oom.rung.actions[0].kind == "lower_workers"  # the ladder is intact
    vmstat = tmp_path / "vmstat"
    vmstat.write_text("nr_free_pages 10\noom_kill 3\n")
    assert oom_kills(vmstat) == 3 and oom_kills(tmp_path / "none") is None
    assert killed_for_memory(3, 3) is False and killed_for_memory(3, 4) is True and killed_for_memory(None, 4) is None
