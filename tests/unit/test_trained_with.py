"""What the final weights were trained with (issue 29), from hand-written journals: each remedy's
change from the first step trained with it, why, and until a new supervisor went back to the user's
recipe; the file written at the run's end and its one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainsup.run.trainedwith import AS_GIVEN, FILE_NAME, changes, conclude, load, summary

OOM_1 = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
OOM_2 = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB"
ALLOC = "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
RESTART = "restart from the last safe state"


def start(attempt: int, step: int) -> dict[str, Any]:
    return {"event": "attempt_start", "attempt": attempt, "resume_step": step,
            "resume_from": f"out/s{step}" if step else None}


def end(attempt: int, step: int) -> dict[str, Any]:
    return {"event": "attempt_end", "attempt": attempt, "step": step}


def fault(cls: str, evidence: str, attempt: int) -> dict[str, Any]:
    return {"event": "fault", "class": cls, "evidence": evidence, "line": 40, "attempt": attempt}


def remedy(cls: str, *actions: str) -> dict[str, Any]:
    return {"event": "remedy", "class": cls, "rung": 0, "actions": list(actions), "delay_s": 1}


RUN_START = {"event": "run_start", "project": "lora"}

# Two remedies, a restart of trainsup between them, and a later attempt that resumed from an earlier state.
JOURNAL = [
    RUN_START, start(1, 0), end(1, 6), fault("cuda_oom", OOM_1, 1), remedy("cuda_oom", ALLOC),
    start(2, 4), end(2, 10),
    {"event": "gave_up", "reason": "stopped by SIGTERM", "exit_code": 143, "attempt": 2},
    RUN_START,  # a new supervisor: the user's recipe again, from its first attempt on
    start(3, 8), end(3, 12), fault("hang", "no progress for 300 s at step 12", 3), remedy("hang", RESTART),
    start(4, 12), end(4, 13), fault("cuda_oom", OOM_2, 4),
    {"event": "remedy_skipped", "class": "cuda_oom", "rung": 0, "actions": ALLOC},
    remedy("cuda_oom", "add --gradient_checkpointing"),
    start(5, 12), end(5, 15), fault("nan_loss", "loss is nan at step 15", 5), remedy("nan_loss", RESTART),
    start(6, 10),  # the states after the NaN's last good one are void: resumed from step 10
    end(6, 20),
]


def test_two_remedies_a_restart_between_and_a_resume_from_an_earlier_state() -> None:
    assert changes(JOURNAL) == [
        {"change": ALLOC, "why": {"class": "cuda_oom", "evidence": OOM_1, "attempt": 1}, "attempt": 2,
         "from_step": 4, "until_step": 8, "environment": False},
        {"change": "add --gradient_checkpointing", "why": {"class": "cuda_oom", "evidence": OOM_2, "attempt": 4},
         "attempt": 5, "from_step": 10, "until_step": None, "environment": False},
    ]
    assert summary(changes(JOURNAL)) == (
        f"trained with: {ALLOC} from step 4 until step 8 (a new supervisor started from your recipe) "
        f"(cuda_oom: {OOM_1}); add --gradient_checkpointing from step 10 (cuda_oom: {OOM_2})")


def test_a_resume_before_a_dropped_change_shortens_it_and_one_that_kept_nothing_is_left_out() -> None:
    # the new supervisor's later attempt resumed from step 6: the change's steps after 6 were not kept
    shorter = [*JOURNAL[:-2], start(6, 6), end(6, 20)]
    got = changes(shorter)
    assert [(c["change"], c["from_step"], c["until_step"]) for c in got] == [
        (ALLOC, 4, 6), ("add --gradient_checkpointing", 6, None)]
    # ... and from step 4 or earlier: nothing trained with it is in the final weights
    gone = [*JOURNAL[:-2], start(6, 2), end(6, 20)]
    assert [(c["change"], c["from_step"]) for c in changes(gone)] == [("add --gradient_checkpointing", 2)]


def test_no_remedy_a_plain_restart_and_a_remedy_never_launched_are_the_recipe_as_given() -> None:
    plain = [RUN_START, start(1, 0), end(1, 5), fault("hang", "no progress", 1), remedy("hang", RESTART),
             start(2, 4), end(2, 5), fault("cuda_oom", OOM_1, 2),
             remedy("cuda_oom", "wait for other programs to free the GPUs' memory, then restart with the same flags"),
             start(3, 4), end(3, 6), fault("cuda_oom", OOM_1, 3), remedy("cuda_oom", ALLOC),
             {"event": "gave_up", "reason": "stopped by SIGINT", "exit_code": 130}]  # stopped in the backoff
    assert changes(plain) == [] and summary([]) == AS_GIVEN


def test_an_environment_upgrade_outlives_a_new_supervisor_and_a_failed_one_is_no_change() -> None:
    journal = [RUN_START, start(1, 0), end(1, 4), fault("fp8_serializer", "KeyError: torch.float8_e4m3fn", 1),
               {"event": "environment_upgrade", "python": "/v/bin/python", "spec": "safetensors>=0.4.2",
                "exit_code": 0},
               remedy("fp8_serializer", "upgraded safetensors>=0.4.2"), start(2, 0), end(2, 6),
               RUN_START, start(3, 4), end(3, 8),
               {"event": "environment_upgrade", "spec": "safetensors>=0.4.3", "exit_code": 1}]
    (upgrade,) = changes(journal)
    assert upgrade["change"] == "upgraded safetensors>=0.4.2" and upgrade["environment"] is True
    assert (upgrade["attempt"], upgrade["from_step"], upgrade["until_step"]) == (2, 0, None)
    assert upgrade["why"]["class"] == "fp8_serializer"


def test_a_later_run_in_the_same_dir_does_not_inherit_a_finished_runs_changes() -> None:
    journal = [RUN_START, start(1, 0), end(1, 6), fault("cuda_oom", OOM_1, 1), remedy("cuda_oom", ALLOC),
               start(2, 4), end(2, 10), {"event": "finished", "reason": "exit 0"},
               RUN_START, start(3, 0), end(3, 10)]
    assert changes(journal) == []


def test_conclude_writes_the_file_says_the_line_and_returns_the_list(tmp_path: Path) -> None:
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in JOURNAL))
    said: list[str] = []
    got = conclude(tmp_path, "finish", said.append, clock=lambda: 1_790_000_000.0)
    assert got == changes(JOURNAL)
    assert said == [summary(got)] and said[0].startswith("trained with: set PYTORCH_CUDA_ALLOC_CONF")
    written = json.loads((tmp_path / FILE_NAME).read_text())
    assert written == {"end": "finished", "ts": 1_790_000_000.0, "summary": said[0], "changes": got}
    assert load(tmp_path) == written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events.jsonl", FILE_NAME]  # no temp file left
    # a stop of a run with no remedy: the file says so
    (tmp_path / "events.jsonl").write_text(json.dumps(RUN_START) + "\n" + json.dumps(start(1, 0)) + "\n")
    assert conclude(tmp_path, "signal", said.append) == []
    assert said[-1] == AS_GIVEN and load(tmp_path)["end"] == "stopped"  # type: ignore[index]


def test_a_file_that_cannot_be_written_is_said_and_the_list_still_returned(tmp_path: Path) -> None:
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in JOURNAL))
    (tmp_path / FILE_NAME).mkdir()  # os.replace cannot put a file over a folder
    said: list[str] = []
    assert conclude(tmp_path, "give_up", said.append) == changes(JOURNAL)
    assert said[0].startswith(f"warning: cannot write {tmp_path / FILE_NAME}") and said[1].startswith("trained with:")
    assert load(tmp_path) is None
