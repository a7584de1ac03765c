"""Run identity (issue 29): which run dir holds this run, what a dataset summary ignores, when a run
counts as finished, and the refusals that keep one run dir one run's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainsup.record.identity import (
    Identity,
    IdentityError,
    choose,
    files_summary,
    find_same,
    read_past,
    write_identity,
)

ARGV = ("python", "train.py", "--output_name", "cat")


def ident(**fields: object) -> Identity:
    return Identity({"trainer": "kohya", "output_name": "cat", "network_dim": "4", **fields})


def recorded(run_dir: Path, identity: Identity, *events: dict[str, object]) -> Path:
    run_dir.mkdir(parents=True)
    write_identity(run_dir, identity, "cat")
    with open(run_dir / "events.jsonl", "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(e) + "\n" for e in events)
    return run_dir


def test_an_empty_output_dir_gets_the_default_run_dir(tmp_path: Path) -> None:
    base = tmp_path / "out" / ".trainsup"
    choice = choose(base, ident(), ARGV, "cat", explicit=False, fresh=False)
    assert choice.run_dir == base and choice.past is None and not choice.others


def test_the_same_run_continues_in_its_own_run_dir(tmp_path: Path) -> None:
    base = recorded(tmp_path / ".trainsup", ident(), {"event": "run_start", "ts": 1, "argv": list(ARGV)})
    choice = choose(base, ident(), ARGV, "cat", explicit=False, fresh=False)
    assert choice.run_dir == base and choice.past is not None and choice.past.ended is None


def test_another_run_gets_a_run_dir_of_its_own_and_the_note_names_the_difference(tmp_path: Path) -> None:
    base = recorded(tmp_path / ".trainsup", ident(output_name="alpha"))
    ours = ident(output_name="beta", network_dim="8")
    choice = choose(base, ours, ARGV, "beta", explicit=False, fresh=False)
    assert choice.run_dir == tmp_path / ".trainsup-beta" and choice.past is None
    note = choice.note(ours) or ""
    assert "output_name: alpha -> beta" in note and "network_dim: 4 -> 8" in note and "starts fresh" in note
    recorded(choice.run_dir, ours)
    # A third run of the same name but another seed: the next free generation, never a taken one.
    third = choose(base, ident(output_name="beta", seed="9"), ARGV, "beta", explicit=False, fresh=False)
    assert third.run_dir == tmp_path / ".trainsup-beta-2"
    # And beta, started again, finds its own.
    assert choose(base, ours, ARGV, "beta", explicit=False, fresh=False).run_dir == tmp_path / ".trainsup-beta"
    assert find_same(base, ours, ARGV) is not None


def test_fresh_starts_a_new_generation_and_a_named_run_dir_is_never_shared(tmp_path: Path) -> None:
    base = recorded(tmp_path / ".trainsup", ident())
    assert choose(base, ident(), ARGV, "cat", explicit=False, fresh=True).run_dir == tmp_path / ".trainsup-cat"
    with pytest.raises(IdentityError, match="--fresh"):
        choose(base, ident(), ARGV, "cat", explicit=True, fresh=True)
    with pytest.raises(IdentityError, match="another run's records"):
        choose(base, ident(network_dim="8"), ARGV, "cat", explicit=True, fresh=False)


def test_a_run_dir_from_before_identities_is_this_run_when_its_command_is(tmp_path: Path) -> None:
    base = tmp_path / ".trainsup"
    base.mkdir()
    (base / "events.jsonl").write_text(json.dumps({"event": "run_start", "ts": 5, "argv": list(ARGV)}) + "\n",
                                       encoding="utf-8")
    assert choose(base, ident(), ARGV, "cat", explicit=False, fresh=False).run_dir == base
    other = choose(base, ident(), (*ARGV, "--seed", "2"), "cat", explicit=False, fresh=False)
    assert other.run_dir == tmp_path / ".trainsup-cat"


def test_finished_is_the_last_end_unless_a_supervisor_started_after_it(tmp_path: Path) -> None:
    run_dir = recorded(tmp_path / "r", ident(), {"event": "run_start", "ts": 1, "argv": list(ARGV)},
                       {"event": "gave_up", "ts": 2}, {"event": "run_start", "ts": 3},
                       {"event": "finished", "ts": 4, "final_weights": "/o/cat.safetensors"})
    past = read_past(run_dir)
    assert past is not None and past.ended == "finished" and past.final_weights == "/o/cat.safetensors"
    with open(run_dir / "events.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"event": "run_start", "ts": 5}) + "\n")
    past = read_past(run_dir)
    assert past is not None and past.ended is None


def test_the_dataset_summary_ignores_captions_and_caches(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for name in ("a.png", "b.jpg"):
        (data / name).write_bytes(b"x")
    before = files_summary([data])
    (data / "a.txt").write_text("a caption, edited mid-run", encoding="utf-8")
    (data / "a_0512x0512.npz").write_bytes(b"latents")
    assert files_summary([data]) == before
    (data / "c.webp").write_bytes(b"x")
    assert files_summary([data]) != before
    assert files_summary([tmp_path / "nowhere"]) == {str(tmp_path / "nowhere"): {"missing": True}}
