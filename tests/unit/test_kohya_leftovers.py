"""An earlier attempt's own save that was cut mid-save (its trainer killed inside it) is moved out of the
output dir's sight when the next attempt begins: no attempt will finish it, and no uninterrupted run
would show it. Found by the real chaos soak (seed 182261230: a trainer killed inside the save of step
20 under attempt 2's name left ``tiny-trainsup2-step00000012-state`` and its weights visible)."""

from __future__ import annotations

from pathlib import Path

from trainsup.adapters.kohya.exact import AttemptSaves
from trainsup.adapters.kohya.points import Cadence, ResumePoints, attempt_notes
from trainsup.record.journal import Journal, read_events
from trainsup.record.ledger import AttemptRecord, Ledger
from trainsup.trainers.base import Launch


def begin(points: ResumePoints, attempt: int, resume_step: int, name: str, skips: bool = True) -> AttemptSaves:
    """An attempt entered as kohya's launch plans it and the engine then begins it."""
    points.plan_attempt(attempt, resume_step, name, skips)
    offset = 0 if resume_step == 0 else None if skips else resume_step
    points.begin(attempt, Launch((), {}, resume_step, name, offset))
    return points.saves



def test_an_earlier_attempts_cut_save_is_set_aside_and_nothing_else_moves(tmp_path: Path) -> None:
    out, run_dir = tmp_path / "out", tmp_path / "out" / ".trainsup"
    run_dir.mkdir(parents=True)
    cut = out / "tiny-trainsup2-step00000012-state"
    cut.mkdir()
    (cut / "model.safetensors").write_bytes(b"cut short")
    (out / "tiny-trainsup2-step00000012.safetensors").write_bytes(b"weights")
    kept = [out / "tiny-step00000010.safetensors", out / "tiny-trainsup20-note.txt", out / "tiny.toml"]
    for path in kept:
        path.write_text("the user's, or not an attempt's name")
    ledger = Ledger.load(run_dir / "ledger.json")
    ledger.attempts += [AttemptRecord(1, "tiny", 0, 0, 1.0), AttemptRecord(2, "tiny-trainsup2", 8, 8, 2.0,
                                                                                    attempt_notes(False))]
    journal = Journal(run_dir)
    points = ResumePoints(ledger, out, False, journal, lambda _m: None, "tiny", Cadence(20, 5, None), run_dir)
    begin(points, 3, 16, "tiny-trainsup3", skips=False)
    journal.close()
    assert not cut.exists() and not (out / "tiny-trainsup2-step00000012.safetensors").exists()
    assert (run_dir / "set-aside" / cut.name / "model.safetensors").read_bytes() == b"cut short"
    assert (run_dir / "set-aside" / "tiny-trainsup2-step00000012.safetensors").read_bytes() == b"weights"
    assert all(path.exists() for path in kept)
    moved = [e for e in read_events(run_dir) if e["event"] == "state_set_aside"]
    assert len(moved) == 2 and all("attempt 2's own save" in e["why"] for e in moved)
