"""The policy's ``exit_codes:`` (trainsup run's codes remapped for a scheduler's convention): its keys,
their errors, and ``commands.exitcodes.remap``; the CLI applying it is in tests/component/test_exit_codes.py."""

from __future__ import annotations

import pytest

from trainsup.commands import exitcodes
from trainsup.commands.exitcodes import remap
from trainsup.run.policy import EXIT_CODE_NAMES, ExitCodesPolicy, PolicyError, parse_policy


def test_the_keys_parse_and_default_to_trainsups_own_codes() -> None:
    assert parse_policy("", "p.yaml").exit_codes == ExitCodesPolicy()
    p = parse_policy("exit_codes:\n  gave_up: 64\n  fault: 65\n  sigint: 0\n  sigterm: 143\n  deadline: null\n",
                     "p.yaml")
    assert p.exit_codes == ExitCodesPolicy(gave_up=64, fault=65, sigint=0, sigterm=143)
    assert p.exit_codes.given() == {"gave_up": 64, "fault": 65, "sigint": 0, "sigterm": 143}
    assert set(EXIT_CODE_NAMES) == set(ExitCodesPolicy.__dataclass_fields__)


@pytest.mark.parametrize(("text", "error"), [
    ("exit_codes:\n  fault: 0\n", ("p.yaml:2: exit_codes.fault: expected null or an exit code 1..255 (0 would report "
                                 "a failure as success), got 0")),
    ("exit_codes:\n  gave_up: three\n", "p.yaml:2: exit_codes.gave_up: expected null or an exit code 1..255"),
    ("exit_codes:\n  sigterm: 256\n", "p.yaml:2: exit_codes.sigterm: expected null or an exit code 0..255, got 256"),
    ("exit_codes:\n  deadline: true\n", ("p.yaml:2: exit_codes.deadline: expected null or an exit code 0..255, "
                                        "got True")),
    ("exit_codes:\n  usage: 5\n", ("p.yaml:2: exit_codes.usage: unknown key; expected one of deadline, fault, "
                                  "gave_up, sigint, sigterm")),
    ("exit_codes: [3]\n", "p.yaml:1: exit_codes: expected a mapping"),
    ("slurm:\n  exit_code_after_requeue: 75\nexit_codes:\n  deadline: 76\n",
     ("p.yaml:4: exit_codes.deadline: expected null while slurm.exit_code_after_requeue (line 2) sets the same "
     "code, got 76; give one of them")),
])
def test_errors_name_the_key_and_the_bad_value(text: str, error: str) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, "p.yaml")
    assert str(caught.value).startswith(error)


def test_each_named_code_is_remapped_and_the_rest_are_left_alone() -> None:
    p = parse_policy("exit_codes:\n  gave_up: 64\n  fault: 65\n  sigint: 66\n  sigterm: 67\n  deadline: 68\n", "p")
    assert remap(exitcodes.GAVE_UP, p, {}) == (64, "exit_codes.gave_up")
    assert remap(exitcodes.STOPPED_ON_FAULT, p, {}) == (65, "exit_codes.fault")
    assert remap(exitcodes.SIGINT, p, {}) == (66, "exit_codes.sigint")
    assert remap(exitcodes.SIGTERM, p, {}) == (67, "exit_codes.sigterm")
    assert remap(exitcodes.DEADLINE, p, {}) == (68, "exit_codes.deadline")
    for code in (exitcodes.FINISHED, exitcodes.USAGE, exitcodes.INTERNAL, 1, 140):
        assert remap(code, p, {}) == (code, None)


def test_only_the_keys_given_change_a_code() -> None:
    p = parse_policy("exit_codes:\n  fault: 65\n", "p")
    assert remap(4, p, {}) == (65, "exit_codes.fault")
    assert remap(3, p, {}) == (3, None) and remap(143, p, {}) == (143, None)
    assert remap(4, parse_policy("", "p"), {}) == (4, None)


def test_the_deadline_code_follows_the_deadline_signal() -> None:
    p = parse_policy("slurm:\n  deadline_signal: USR2\nexit_codes:\n  deadline: 99\n", "p")
    assert remap(140, p, {}) == (99, "exit_codes.deadline")  # 128 + SIGUSR2
    assert remap(138, p, {}) == (138, None)


def test_trainsup_serve_entries_keep_the_native_codes() -> None:
    p = parse_policy("exit_codes:\n  sigterm: 0\n", "p")
    assert remap(143, p, {"TRAINSUP_EXIT_CODES": "native"}) == (143, None)
    assert remap(143, p, {"TRAINSUP_EXIT_CODES": "other"}) == (0, "exit_codes.sigterm")
