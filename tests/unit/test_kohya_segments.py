"""A resumed sd-scripts attempt, on disk: it covers a segment up to an epoch's end when one cadence for
the rest of the run would save too often, asks to be relaunched once that epoch's state is complete,
and its samples are published under the user's name and their true steps."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from trainsup.adapters.kohya.exact import AttemptSaves
from trainsup.adapters.kohya.points import Cadence, ResumePoints, attempt_notes
from trainsup.adapters.kohya.samples import SampleCadence, SampleShelf, complete_png, parse
from trainsup.record.journal import Journal, read_events
from trainsup.record.ledger import AttemptRecord, Ledger
from trainsup.trainers.base import Launch

PNG = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000"
                    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082")
STAMP = "_20261126120000"

def begin(points: ResumePoints, attempt: int, resume_step: int, name: str, skips: bool = True) -> AttemptSaves:
    """An attempt entered as kohya's launch plans it and the engine then begins it."""
    points.plan_attempt(attempt, resume_step, name, skips)
    offset = 0 if resume_step == 0 else None if skips else resume_step
    points.begin(attempt, Launch((), {}, resume_step, name, offset))
    return points.saves



def save(out: Path, name: str, label: int) -> None:
    """A complete kohya save: the weights file and the state dir (its last file written last)."""
    save_file({"lora.down": np.full((2, 2), label, np.float32)}, str(out / f"{name}.safetensors"))
    state = out / f"{name}-state"
    state.mkdir()
    (state / "train_state.json").write_text(json.dumps({"current_epoch": 1, "current_step": label}))
    save_file({"lora.down": np.full((2, 2), label, np.float32)}, str(state / "model.safetensors"))
    for part in ("optimizer.bin", "scheduler.bin", "random_states_0.pkl"):
        (state / part).write_bytes(b"x")


def sample(out: Path, name: str) -> Path:
    path = out / "sample" / f"{name}{STAMP}.png"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(PNG)
    return path


def points_after_a_kill_at_state_10(tmp_path: Path) -> tuple[ResumePoints, Path, Path, Journal]:
    """The bed's run (8 steps an epoch, a save every 5, 20 steps, a sample every 10), its trainer
    killed after the state of step 10: the steps 5 and 10 and the sample of 10 under their names."""
    out, run_dir = tmp_path / "out", tmp_path / "out" / ".trainsup"
    run_dir.mkdir(parents=True)
    ledger = Ledger.load(run_dir / "ledger.json")
    journal = Journal(run_dir)
    points = ResumePoints(ledger, out, False, journal, lambda _m: None, "tiny", Cadence(20, 5, None), run_dir,
                          SampleCadence(10, None, True, 20))
    points.run_started = points.publisher.run_started = time.time() - 60
    assert points.samples is not None
    points.samples.run_started = points.run_started
    ledger.attempts.append(AttemptRecord(1, "tiny", 0, 0, points.run_started, attempt_notes(True, 8, 1)))
    points.attempt = 1
    for step in (5, 10):
        save(out, f"tiny-step{step:08d}", step)
        ledger.record_state(out / f"tiny-step{step:08d}-state", 1, step)
    sample(out, "tiny_e000000_00")
    sample(out, "tiny_000010_00")
    return points, out, run_dir, journal


def test_the_bed_kill_relaunches_at_16_and_publishes_true_names(tmp_path: Path) -> None:
    points, out, run_dir, journal = points_after_a_kill_at_state_10(tmp_path)
    plan = begin(points, 2, 8, "tiny-trainsup2", skips=False)
    # Step 10 is shown already; one cadence for 15 and 20 would be 1: a segment to the end of epoch 2.
    assert (plan.every, plan.wanted, plan.relaunch_at, plan.sample_every) == (7, frozenset({15, 20}), 16, 0)
    save(out, "tiny-trainsup2-step00000007", 7)  # step 15
    sample(out, "tiny-trainsup2_000002_00")  # a stray one (step 10, shown already): hidden, never published
    points.collect()
    assert (out / "tiny-step00000015.safetensors").is_file() and not points.relaunch_at_state
    assert json.loads((out / "tiny-step00000015-state" / "train_state.json").read_text())["current_step"] == 15
    save(out, "tiny-trainsup2-000002", 8)  # the state trainsup saves at the end of epoch 2: step 16
    points.collect()
    assert points.relaunch_at_state and not points.run_complete
    plan = begin(points, 3, 16, "tiny-trainsup3", skips=False)
    assert (plan.every, plan.wanted, plan.stop_at, plan.relaunch_at, plan.sample_every) == (4, frozenset({20}), 20,
                                                                                             None, 4)
    assert not points.relaunch_at_state
    save(out, "tiny-trainsup3-step00000004", 4)  # step 20: the run is complete
    sample(out, "tiny-trainsup3_000004_00")
    points.collect()
    assert points.run_complete
    assert points.publish_final() == str(out / "tiny.safetensors")
    journal.close()
    shown = sorted(p.name for p in (out / "sample").iterdir())
    assert shown == sorted([f"tiny_e000000_00{STAMP}.png", f"tiny_000010_00{STAMP}.png", f"tiny_000020_00{STAMP}.png"])
    assert sorted(p.name for p in out.glob("tiny-step*")) == sorted(
        f"tiny-step{s:08d}{end}" for s in (5, 10, 15, 20) for end in (".safetensors", "-state"))
    events = read_events(run_dir)
    relaunch = [e for e in events if e["event"] == "segment_relaunch"]
    assert len(relaunch) == 1 and relaunch[0]["step"] == 16 and "12 step saves for 2" in relaunch[0]["why"]
    assert [e["step"] for e in events if e["event"] == "sample_published"] == [20]
    assert {Path(e["file"]).name for e in events if e["event"] == "sample_hidden"} == {
        f"tiny-trainsup2_000002_00{STAMP}.png", f"tiny-trainsup3_000004_00{STAMP}.png"}
    assert sorted(p.name for p in (run_dir / "saves" / "samples").iterdir()) == [
        f"tiny-trainsup2_000002_00{STAMP}.png", f"tiny-trainsup3_000004_00{STAMP}.png"]


def test_a_user_epoch_save_at_the_segment_end_waits_for_the_epoch_state(tmp_path: Path) -> None:
    points, out, _run_dir, journal = points_after_a_kill_at_state_10(tmp_path)
    points.cadence = Cadence(20, 5, 1)  # the user saves every epoch too: that save must be its own
    begin(points, 2, 8, "tiny-trainsup2", skips=False)
    points.saves = points.saves.__class__(8, 8, frozenset({15, 20}), None, 0, 16, "why")  # labels 8: step 16
    save(out, "tiny-trainsup2-step00000008", 8)
    points.collect()
    assert not points.relaunch_at_state  # a step state at 16, but the user shows epoch 2's own save
    save(out, "tiny-trainsup2-000002", 8)
    points.collect()
    journal.close()
    assert points.relaunch_at_state and (out / "tiny-000002.safetensors").is_file()


def test_epoch_samples_at_the_segment_end_come_before_the_relaunch(tmp_path: Path) -> None:
    points, out, _run_dir, journal = points_after_a_kill_at_state_10(tmp_path)
    assert points.samples is not None
    points.samples.cadence = SampleCadence(None, 1, False, 20)
    seen = [0]
    points.epoch_seen = lambda: seen[0]
    begin(points, 2, 8, "tiny-trainsup2", skips=False)
    save(out, "tiny-trainsup2-step00000007", 7)
    save(out, "tiny-trainsup2-000002", 8)
    points.collect()
    assert not points.relaunch_at_state  # sd-scripts samples epoch 2 after its state
    sample(out, "tiny-trainsup2_e000002_00")
    seen[0] = 3  # `epoch 3/3`: epoch 2's end is behind it
    points.collect()
    journal.close()
    assert points.relaunch_at_state
    assert (out / "sample" / f"tiny_e000002_00{STAMP}.png").is_file()  # epoch numbers are true: renamed only


def test_a_sample_shelf_leaves_a_sample_being_written_and_hides_it_once_its_attempt_ended(tmp_path: Path) -> None:
    events: list[tuple[str, dict[str, object]]] = []
    shelf = SampleShelf(tmp_path / "sample", tmp_path / "run", "lora", SampleCadence(10, None, False, 40), 0.0,
                        lambda kind, **fields: events.append((kind, fields)))
    cut = sample(tmp_path, "lora-trainsup2_000012_01")
    cut.write_bytes(PNG[:-4])
    done = sample(tmp_path, "lora-trainsup2_000012_00")
    shelf.settle("lora-trainsup2", 8, ended=False)
    assert cut.exists() and not done.exists() and not complete_png(cut)
    assert (tmp_path / "sample" / f"lora_000020_00{STAMP}.png").read_bytes() == PNG
    shelf.settle("lora-trainsup2", 8, ended=True)
    assert not cut.exists() and [e[1]["why"] for e in events if e[0] == "sample_hidden"][-1] == "cut short"
    assert parse(f"lora_e000002_03{STAMP}_42.png", "lora") is not None
    assert parse(f"lora-trainsup2_000002_00{STAMP}.png", "lora") is None
    assert parse("000002_00.png", None) is not None and parse("prompts_used.jsonl", None) is None


def _mp4(*boxes: tuple[bytes, bytes]) -> bytes:
    return b"".join((8 + len(body)).to_bytes(4, "big") + kind + body for kind, body in boxes)


def test_a_video_models_mp4_samples_are_published_at_their_true_steps_and_cut_ones_hidden(tmp_path: Path) -> None:
    """musubi-tuner writes a video model's sample as ``NAME_STEP6_II_TIMESTAMP[_SEED].mp4``: an attempt's
    complete one is published at its true step, one cut while written (its boxes do not reach the end,
    or it has no index yet) is left while its attempt runs and hidden once it ended."""
    events: list[tuple[str, dict[str, object]]] = []
    shelf = SampleShelf(tmp_path / "sample", tmp_path / "run", "tiny", SampleCadence(10, None, False, 40), 0.0,
                        lambda kind, **fields: events.append((kind, fields)))
    (tmp_path / "sample").mkdir()
    video = _mp4((b"ftyp", b"isom\x00\x00\x02\x00"), (b"mdat", b"\x01" * 64), (b"moov", b"\x02" * 32))
    done = tmp_path / "sample" / f"tiny-trainsup2_000002_00{STAMP}_42.mp4"
    done.write_bytes(video)
    cut = tmp_path / "sample" / f"tiny-trainsup2_000002_01{STAMP}_42.mp4"
    cut.write_bytes(video[:-10])
    no_index = tmp_path / "sample" / f"tiny-trainsup2_000002_02{STAMP}_42.mp4"
    no_index.write_bytes(_mp4((b"ftyp", b"isom"), (b"mdat", b"\x01" * 64)))
    shelf.settle("tiny-trainsup2", 8, ended=False)
    assert (tmp_path / "sample" / f"tiny_000010_00{STAMP}_42.mp4").read_bytes() == video
    assert cut.exists() and no_index.exists() and not done.exists()
    shelf.settle("tiny-trainsup2", 8, ended=True)
    assert not cut.exists() and not no_index.exists()
    assert sorted(p.name for p in (tmp_path / "sample").iterdir()) == [f"tiny_000010_00{STAMP}_42.mp4"]
    assert [e[1]["why"] for e in events if e[0] == "sample_hidden"][-2:] == ["cut short", "cut short"]
