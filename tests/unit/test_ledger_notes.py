"""The ledger keeps trainer-neutral data; an adapter's own facts of an attempt live in its notes.

A run dir from before notes existed holds kohya's facts (``skips``, ``batches``, ``grad_accum``) as
fields of each attempt: it still loads, kohya still reads them, and it resumes with the same plan.
"""

from __future__ import annotations

import json
from pathlib import Path

from trainsup.adapters.kohya.exact import label_offset
from trainsup.adapters.kohya.points import Cadence, ResumePoints, attempt_notes, ledger_per_epoch, skips
from trainsup.record.journal import Journal
from trainsup.record.ledger import AttemptRecord, Ledger

# As trainsup wrote it before notes: attempt 1 from scratch (8 batches an epoch, accumulation 2),
# attempt 2 resumed mid-epoch at step 6 with --skip_until_initial_step, its summary not yet seen.
OLD = {
    "attempts": [
        {"attempt": 1, "output_name": "tiny", "resume_step": 0, "offset": 0, "started": 1.0,
         "skips": True, "batches": 8, "grad_accum": 2},
        {"attempt": 2, "output_name": "tiny-trainsup2", "resume_step": 6, "offset": None, "started": 2.0,
         "skips": True, "batches": None, "grad_accum": None},
    ],
    "states": [{"dir": "/out/tiny-step00000006-state", "step": 6, "attempt": 1, "label": 6}],
    "bad_states": [],
}


def test_an_old_ledger_loads_with_kohyas_fields_as_its_notes(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    path.write_text(json.dumps(OLD))
    ledger = Ledger.load(path)
    assert path.exists() and not path.with_name("ledger.json.unreadable").exists()  # not set aside
    first, second = ledger.attempts
    assert first.notes == attempt_notes(True, 8, 2) and second.notes == attempt_notes(True)
    assert (first.resume_step, first.offset, second.offset) == (0, 0, None)
    assert ledger_per_epoch(ledger) == 4 and skips(second)
    assert ledger.states[0].step == 6
    # Saved again, the notes round-trip and the ledger's own fields stay where they were.
    ledger.save()
    data = json.loads(path.read_text())
    assert data["attempts"][0]["notes"] == {"skips": True, "batches": 8, "grad_accum": 2}
    assert "batches" not in data["attempts"][0] and data["attempts"][0]["resume_step"] == 0
    again = Ledger.load(path)
    assert [a.notes for a in again.attempts] == [a.notes for a in ledger.attempts]


def test_kohya_plans_a_resumed_attempt_of_an_old_ledger_from_its_notes(tmp_path: Path) -> None:
    """Attempt 2's offset is unknown until its summary: kohya works it out from attempt 1's notes,
    as it did when they were fields, and fixes it from the summary it then reads."""
    out, run_dir = tmp_path / "out", tmp_path / "out" / ".trainsup"
    run_dir.mkdir(parents=True)
    (run_dir / "ledger.json").write_text(json.dumps(OLD))
    ledger = Ledger.load(run_dir / "ledger.json")
    journal = Journal(run_dir)
    points = ResumePoints(ledger, out, False, journal, lambda _m: None, "tiny", Cadence(20, 5, None), run_dir)
    points.continue_ledger()
    assert points.per_epoch() == 4
    assert points.saves.offset == label_offset(6, True, 8, 2)
    points.summary(8, 2)
    assert ledger.attempt(2).offset == label_offset(6, True, 8, 2)
    assert ledger.attempt(2).notes == attempt_notes(True, 8, 2)
    journal.close()


def test_a_neutral_attempt_has_no_notes_and_unknown_keys_are_the_adapters(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    Ledger(path, [AttemptRecord(1, None, 0, 0, 1.0)]).save()
    assert json.loads(path.read_text())["attempts"][0]["notes"] == {}
    data = json.loads(path.read_text())
    data["attempts"][0]["notes"] = {"kept": 1}
    data["attempts"][0]["stray"] = "x"
    path.write_text(json.dumps(data))
    assert Ledger.load(path).attempts[0].notes == {"kept": 1, "stray": "x"}
