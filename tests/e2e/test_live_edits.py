"""Live edits under `trainsup run`: prompt edits applied at checkpoints instead of crashing the run,
invalid edits rejected, caption edits invalidating exactly the stale text-encoder cache."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from tests.e2e.demo_harness import clean_env, demo_argv, supervise

V2 = "a lighthouse at dusk --w 16 --h 16 --s 4\n"
V3 = "a cabin in deep snow --w 16 --h 16 --s 4\n"


def sampling_rounds(out: Path) -> list[set[str]]:
    """The prompts of each sampling round, in the order they ran (kohya labels resumed samples with
    its restarted step counter, so order, not the label, tells which round came when)."""
    rounds: list[set[str]] = []
    last = None
    for line in (out / "sample" / "prompts_used.jsonl").read_text().splitlines():
        rec = json.loads(line)
        # NAME_STEP6_II_TIME[_SEED].png: the output name and the step tell a round
        key = (rec["step"], Path(rec["file"]).name.rsplit(f"_{rec['step']:06d}_", 1)[0])
        if key != last:
            rounds.append(set())
            last = key
        rounds[-1].add(rec["prompt"])
    return rounds


def test_prompt_edits_under_te_caching_apply_at_checkpoints_without_a_crash(assets: dict[str, Path],
                                                                            tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.txt"
    shutil.copy(assets["prompts"], prompts)
    original = prompts.read_bytes()
    out = tmp_path / "out"
    edits: list[str] = []

    def edit(event: dict) -> None:
        if event["event"] != "state_saved":
            return
        if event["step"] == 4 and not edits:  # vim / VS Code style: write elsewhere, rename over
            tmp = tmp_path / ".prompts.txt.swp"
            tmp.write_text(V2)
            os.replace(tmp, prompts)
            edits.append("rename")
        elif event["step"] == 12 and len(edits) == 1:  # truncate and write in place
            with open(prompts, "r+") as fh:
                fh.truncate(0)
                fh.write(V3)
            edits.append("in-place")

    flags = ("--cache_text_encoder_outputs", "--sample_prompts", str(prompts), "--sample_every_n_steps", "2")
    run = supervise(demo_argv("flux_train_network", assets, out, *flags, steps=24), out, tmp_path,
                    env=clean_env(TRAINSUP_DEMO_STEP_SECONDS="0.2"), on_event=edit)
    assert run.returncode == 0, run.stderr[-3000:]
    assert edits == ["rename", "in-place"]
    assert run.of("fault") == []  # no attempt crashed
    kinds = [e["event"] for e in run.events if e["event"] in ("change_scheduled", "change_applied")]
    assert kinds == ["change_scheduled", "change_applied", "change_scheduled", "change_applied"]
    starts = run.of("attempt_start")
    # Each change waited for the next complete checkpoint: the epoch-end state trainsup saves at the
    # edit's own step (4 steps an epoch) when it completes after the change was scheduled, else the
    # next step state.
    zero, a, b = (s["resume_step"] for s in starts)
    assert zero == 0 and a in (4, 8) and b in (12, 16), starts
    # Nothing redone, nothing lost: the attempts trained exactly --max_train_steps between them.
    assert sum(e["steps_trained"] for e in run.of("attempt_end")) == 24
    # Samples after each switch use the new prompts, sampling every 2 steps.
    first = {line.split(" --")[0] for line in original.decode().splitlines() if line and not line.startswith("#")}
    v2, v3 = {V2.split(" --")[0]}, {V3.split(" --")[0]}
    assert sampling_rounds(out) == [first] * (a // 2) + [v2] * ((b - a) // 2) + [v3] * ((24 - b) // 2)
    assert prompts.read_text() == V3  # the user's file is theirs: never rewritten


def test_invalid_prompt_edit_is_rejected_with_its_line_and_the_run_goes_on(assets: dict[str, Path],
                                                                           tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.txt"
    shutil.copy(assets["prompts"], prompts)
    out = tmp_path / "out"
    done: list[bool] = []

    def break_it(event: dict) -> None:
        if event["event"] == "state_saved" and not done:
            prompts.write_text("a fine prompt --w 16\na broken one --w sixteen\n")
            done.append(True)

    flags = ("--cache_text_encoder_outputs", "--sample_prompts", str(prompts), "--sample_every_n_steps", "4")
    run = supervise(demo_argv("flux_train_network", assets, out, *flags), out, tmp_path,
                    env=clean_env(TRAINSUP_DEMO_STEP_SECONDS="0.15"), on_event=break_it)
    assert run.returncode == 0, run.stderr[-3000:]
    rejected = run.of("change_rejected")
    assert len(rejected) == 1 and rejected[0]["line"] == 2 and "--w expects an integer" in rejected[0]["reason"]
    assert len(run.of("attempt_start")) == 1 and run.of("fault") == []
    assert run.of("change_scheduled") == []


def dataset_state(root: Path) -> dict[str, tuple[str, int]]:
    return {str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_caption_edit_invalidates_exactly_that_images_te_cache(assets: dict[str, Path], tmp_path: Path) -> None:
    """A caption edited mid-run applies at the run's next launch (here the relaunch after a simulated
    OOM at step 14; a finished run is never launched again): exactly that image's text-encoder cache is
    set aside, every other dataset file is left as it was."""
    dataset = tmp_path / "dataset"
    shutil.copytree(assets["dataset"], dataset)
    out = tmp_path / "out"
    argv = demo_argv("flux_train_network", assets, out, "--cache_text_encoder_outputs",
                     "--cache_text_encoder_outputs_to_disk")
    argv[argv.index("--train_data_dir") + 1] = str(dataset)
    subset = dataset / "1_demo"
    captions = sorted(subset.glob("*.txt"))
    edited = captions[2]
    seen: list[bool] = []
    before: dict[str, tuple[str, int]] = {}

    def edit_caption(event: dict) -> None:
        if event["event"] == "state_saved" and not seen:
            edited.write_text("a completely different caption\n")
            seen.append(True)
        elif event["event"] == "fault" and not before:  # the attempt ended: the dataset as it left it
            before.update(dataset_state(dataset))

    run = supervise(argv, out, tmp_path, env=clean_env(TRAINSUP_DEMO_STEP_SECONDS="0.1",
                                                       TRAINSUP_DEMO_SIMULATE="cuda_oom@14"),
                    on_event=edit_caption)
    assert run.returncode == 0, run.stderr[-3000:]
    assert {"event": "file_changed", "path": str(edited.resolve()), "kind": "modified"}.items() <= \
        {**run.of("file_changed")[0]}.items()
    assert run.of("change_scheduled")[0]["apply"] == "next_launch"
    cache = subset / f"{edited.stem}_flux_te.npz"
    assert before and str(cache.relative_to(dataset)) in before
    assert len([n for n in before if n.endswith("_flux_te.npz")]) == len(captions)
    moved = run.of("cache_invalidated")
    assert len(moved) == 1 and moved[0]["files"] == [str(cache)]
    kept = list((run.run_dir / "invalidated").glob(f"*/1_demo/{cache.name}"))
    assert len(kept) == 1  # set aside under its path relative to the dataset, not deleted
    after = dataset_state(dataset)
    rel = str(cache.relative_to(dataset))
    for name, digest_and_mtime in before.items():
        if name != rel:
            assert after[name] == digest_and_mtime, f"{name} changed"
    assert rel in after  # the trainer rebuilt it from the new caption
