"""Evidence carries the named groups of the rule pattern that recognised it (issue 30), and the
consumers that choose a remedy read those groups before they would parse the evidence line again:
the remedy path takes one value, ``Said`` (the line and the groups), from the outcome to the rung."""

from __future__ import annotations

from dataclasses import replace

from trainsup.faults.oom import fragmentation_ruled_out
from trainsup.faults.remedies import Action, Rung, ladder, required_spec, upgrade_spec
from trainsup.faults.rules import FaultRule
from trainsup.faults.scanner import FaultScanner
from trainsup.faults.verdict import NOTHING_SAID, Said
from trainsup.run.decide import History, Outcome, decide, record
from trainsup.run.policy import parse_policy
from trainsup.sensors.hang import HangClock, HangPolicy, hang_evidence, hang_groups, hang_spot

REQ = "ImportError: {} is required for a normal functioning of this module, but found {}."


def test_a_rule_match_puts_its_named_groups_on_the_evidence() -> None:
    ev = FaultScanner().feed(REQ.format("safetensors>=0.4.3", "safetensors==0.4.1"), 7)
    assert ev is not None and ev.fault == "fp8_serializer" and ev.lineno == 7
    assert dict(ev.groups) == {"pkg": "safetensors", "specs": ">=0.4.3"}
    ev = FaultScanner().feed(REQ.format("tokenizers>=0.19,<0.20", "tokenizers==0.15.2"), 1)
    assert ev is not None and ev.fault == "missing_dependency"
    assert dict(ev.groups) == {"pkg": "tokenizers", "specs": ">=0.19,<0.20"}


def test_a_user_rules_named_groups_travel_too_and_a_pattern_without_groups_carries_none() -> None:
    rules = (FaultRule(id="config_error", patterns=(r"bad dataset (?P<path>\S+)", r"missing (?:token)(x)?")),)
    ev = FaultScanner(rules).feed("ValueError: bad dataset /data/a.toml", 1)
    assert ev is not None and dict(ev.groups) == {"path": "/data/a.toml"}
    ev = FaultScanner(rules).feed("missing token", 1)
    assert ev is not None and dict(ev.groups) == {}
    ev = FaultScanner().feed("torch.OutOfMemoryError: CUDA out of memory.", 1)
    assert ev is not None and ev.fault == "cuda_oom" and dict(ev.groups) == {}


def test_groups_do_not_make_two_evidences_differ() -> None:
    ev = FaultScanner().feed(REQ.format("safetensors>=0.4.3", "safetensors==0.4.1"), 1)
    assert ev is not None and ev.groups
    assert replace(ev, groups={}) == ev and hash(replace(ev, groups={})) == hash(ev)


def test_required_spec_reads_the_group_before_the_line() -> None:
    misleading = REQ.format("safetensors>=0.3.0", "safetensors==0.2.0")  # the line says one thing
    groups = {"pkg": "safetensors", "specs": ">=0.4.3"}  # the rule's match said another
    assert required_spec(Said(misleading)) == "safetensors>=0.3.0"
    assert required_spec(Said(misleading, groups)) == "safetensors>=0.4.3"
    assert required_spec(Said(None, {"pkg": "tokenizers", "specs": ">=0.19, <0.20"})) == "tokenizers>=0.19,<0.20"
    assert required_spec(Said(misleading, {"path": "x"})) == "safetensors>=0.3.0"  # not its groups: the line
    own = Action("upgrade", "safetensors>=0.4.2")
    assert upgrade_spec(own, Said(misleading)) == "safetensors>=0.4.2"
    assert upgrade_spec(own, Said(misleading, groups)) == "safetensors>=0.4.3"


def test_the_hang_evidence_carries_its_spot_and_decide_reads_it() -> None:
    clock = HangClock(HangPolicy(), now=0)
    clock.on_step(1, 1)
    frames = ["pid 9 wait (threading.py:327)"]
    text = hang_evidence(400, clock, 812, frames, dataloader=False)
    groups = hang_groups(812, frames)
    assert groups == {"spot": "at step 812, pid 9 wait (threading.py:327)"}
    assert hang_spot(text, groups) == hang_spot(text)  # the group and the line agree
    assert hang_groups(812, []) == {}  # no stacks: no spot to recur at
    moved = {"spot": "at step 900, pid 9 wait (threading.py:327)"}
    assert hang_spot(text, moved) == moved["spot"]  # the group, not the line

    def outcome(n: int, groups: dict[str, str]) -> Outcome:
        return Outcome(attempt=n, exit_code=None, signal=9, child_status=None, child_signal=None, uptime_s=500.0,
                       fault="hang", evidence=text, evidence_line=None, steps_trained=10, saved_new_state=True,
                       ended_at=float(n), evidence_groups=groups)

    history = History()
    first = decide(history, outcome(1, groups), parse_policy("", "p"), 10, lambda rung: True)
    record(history, outcome(1, groups), first, 10)
    # The same line, but its spot group says the hang moved on: not the same spot, so a restart.
    assert decide(history, outcome(2, moved), parse_policy("", "p"), 20, lambda rung: True).kind == "restart"
    again = decide(history, outcome(2, groups), parse_policy("", "p"), 20, lambda rung: True)
    assert again.kind == "stop" and "hung again at step 812" in again.reason


# torch 2's OOM message under a per-process cap: 12 MiB reserved but unallocated and 0.05 GiB left under the
# cap cannot hold the 2 GiB it tried to allocate, so the allocator setting is ruled out.
CAPPED = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
          "79.10 GiB of which 40.12 GiB is free. Including non-PyTorch memory, this process has 38.95 GiB memory "
          "in use. 39.00 GiB allowed; Of the allocated memory 37.10 GiB is allocated by PyTorch, and 12.00 MiB is "
          "reserved by PyTorch but unallocated.")


def test_the_oom_numbers_come_from_the_groups_before_the_line() -> None:
    assert fragmentation_ruled_out(Said(CAPPED)) is not None
    # A rule that captured the unallocated memory: its group, not the line, is read (3.2 GiB: room enough).
    assert fragmentation_ruled_out(Said(CAPPED, {"unallocated": "3.20 GiB"})) is None
    # Groups alone: the numbers a trainer's own wording gave, with no torch message to read.
    assert fragmentation_ruled_out(Said("OOM", {"tried": "2 GiB", "unallocated": "1 MiB", "free": "0 MiB"})) \
        == ("only 1.00 MiB reserved but unallocated, less than the 2.00 GiB it tried to allocate: "
            "no fragmentation to undo")
    assert fragmentation_ruled_out(Said(CAPPED, {"unallocated": "lots"})) is not None  # no size: the line's
    allocator = ladder("cuda_oom")[0]
    assert not allocator.fits(Said(CAPPED)) and allocator.fits(Said(CAPPED, {"unallocated": "3.20 GiB"}))


def test_a_rungs_when_reads_the_line_not_the_groups() -> None:
    rung = Rung((Action("restart"),), when=r"block size")
    assert rung.fits(Said("Cannot attend to 9, block size is only 8"))
    assert not rung.fits(Said("something else", {"why": "block size"}))
    assert not rung.fits(NOTHING_SAID) and Rung((Action("restart"),)).fits(NOTHING_SAID)


def test_the_outcome_hands_the_remedy_its_line_and_groups() -> None:
    ev = FaultScanner().feed(REQ.format("safetensors>=0.4.3", "safetensors==0.4.1"), 3)
    assert ev is not None and ev.said == Said(ev.line, {"pkg": "safetensors", "specs": ">=0.4.3"})
    out = Outcome(attempt=1, exit_code=1, signal=None, child_status=None, child_signal=None, uptime_s=1.0,
                  fault=ev.fault, evidence=ev.line, evidence_line=3, steps_trained=0, saved_new_state=False,
                  ended_at=1.0, evidence_groups=ev.groups)
    assert out.said == ev.said
    assert replace(out, evidence_groups={}).said == Said(ev.line)
