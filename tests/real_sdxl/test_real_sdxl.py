"""`trainsup run` over the real sd-scripts SDXL LoRA trainer (``sdxl_train_network.py`` on the CPU) with
the caches the seed faults live beside: a sample-prompt edit mid-run with text-encoder outputs cached, an
image edited mid-run with latents cached to disk and the trainer killed, and the trainer's own refusals of
latent and text-encoder caching beside augmentations remedied one by one.

What the real trainer does, read in its code and seen here: SDXL keeps both text encoders after caching the
dataset's outputs and encodes the sample prompts again at every sampling, from the file as it is then, so an
edited prompt never meets a missing cache entry there (the seed's ``'NoneType' object has no attribute 'to'``
belongs to the scripts that encode their sample prompts once at start-up: Flux, SD3, Lumina). Its latent
cache on disk is checked by keys and shape only, so an image edited in place keeps its old latents across a
resume unless something sets them aside. Runs are short (6 steps, a state every 2); one trainer at a time.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import threading
from pathlib import Path
from typing import Any

from tests.conftest import trainsup_cmd
from tests.e2e.demo_harness import SupervisedRun
from tests.real_sdxl.bed import STEPS_PER_EPOCH, SdxlBed, trainer_pid
from trainsup.demo.story import follow
from trainsup.record.journal import read_events

POLICY = "backoff:\n  initial_s: 0.5\n  max_s: 1\nstop:\n  grace_s: 10\n"
PROMPT = "a red cube --w 64 --h 64 --s 2 --d 1\n"
EDITED = "a blue ball --w 64 --h 64 --s 2 --d 1\n"


def supervise(bed: SdxlBed, argv: list[str], out: Path, tmp: Path, hook: Any = None) -> SupervisedRun:
    """`trainsup run` over ``argv`` from the bed's sd-scripts; ``hook(event, trainsup_pid)`` for each journal
    event as it lands."""
    policy = tmp / "policy.yaml"
    policy.write_text(POLICY)
    proc = subprocess.Popen(trainsup_cmd("run", "--quiet", "--policy", str(policy), "--", *argv), cwd=bed.scripts,
                            env=bed.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    streams: dict[str, str] = {}
    readers = [threading.Thread(target=lambda n=n, s=s: streams.__setitem__(n, s.read()))
               for n, s in (("out", proc.stdout), ("err", proc.stderr))]
    for r in readers:
        r.start()
    try:
        follow(proc, out / ".trainsup", (lambda e: hook(e, proc.pid)) if hook else None, timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for r in readers:
            r.join()
    return SupervisedRun(proc.returncode, streams.get("out", ""), streams.get("err", ""),
                         read_events(out / ".trainsup"), out / ".trainsup")


def sampled_prompts(log: str) -> dict[int, list[str]]:
    """Step -> the prompts the trainer printed for the samples it generated at that step."""
    found: dict[int, list[str]] = {}
    step = None
    for line in log.replace("\r", "\n").splitlines():
        # rich's records: `INFO     generating sample images at step / <the same in Japanese>: 4   file.py:123`
        if m := re.search(r"generating sample images at step\D*(\d+)", line):
            step = int(m.group(1))
            found[step] = []
        elif step is not None and (m := re.search(r"INFO\s+prompt: (.*?)(?:\s{2,}\S+\.py:\d+)?\s*$", line)):
            found[step].append(m.group(1))
    return found


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def finished_all_steps(done: SupervisedRun, out: Path, steps: int = 6) -> None:
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.of("attempt_end")[-1]["step"] == steps
    assert (out / "tiny.safetensors").is_file()


def test_a_sample_prompt_edit_with_text_encoder_outputs_cached_reaches_the_next_samples(
        sdxl_bed: SdxlBed, tmp_path: Path) -> None:
    """--cache_text_encoder_outputs --cache_latents, samples every 2 steps; the user edits the prompt file
    after the state of step 2. SDXL encodes sample prompts afresh at each sampling, so trainsup swaps its
    prompt snapshot at once: one attempt, no fault, no step lost, the samples after the edit show the new
    prompt, the user's file is never rewritten."""
    dataset = sdxl_bed.user_data(tmp_path / "data")
    prompts = tmp_path / "data" / "prompts.txt"
    out = tmp_path / "out"
    argv = sdxl_bed.command(out, dataset, "--cache_text_encoder_outputs", "--cache_latents",
                            "--sample_prompts", str(prompts), "--sample_every_n_steps", "2")

    def edit(event: dict[str, Any], _pid: int) -> None:
        if event["event"] == "state_saved" and event["step"] == 2 and prompts.read_text() == PROMPT:
            prompts.write_text(EDITED)

    done = supervise(sdxl_bed, argv, out, tmp_path, edit)
    finished_all_steps(done, out)
    assert done.of("fault") == [] and len(done.of("attempt_start")) == 1
    assert [e["path"] for e in done.of("change_applied")] == [str(prompts)]
    log = (done.run_dir / "attempt-1.log").read_text(encoding="utf-8", errors="replace")
    assert "--cache_text_encoder_outputs" in " ".join(done.of("attempt_start")[0]["argv"])
    assert "caching Text Encoder outputs" in log
    seen = sampled_prompts(log)
    assert sorted(seen) == [2, 4, 6], seen
    assert seen[2] == ["a red cube"] and seen[6] == ["a blue ball"], seen
    assert "NoneType" not in log
    assert prompts.read_text() == EDITED  # the user's edit, as written
    assert len(list((out / "sample").glob("*.png"))) == 3


def test_an_image_and_a_caption_edited_mid_run_with_caches_on_disk_are_cached_again_at_the_resume(
        sdxl_bed: SdxlBed, tmp_path: Path) -> None:
    """--cache_latents_to_disk --cache_text_encoder_outputs_to_disk: the trainer writes
    ``imgNN_0064x0064_sdxl.npz`` and ``imgNN_te_outputs.npz`` beside each image and takes them as valid after
    any relaunch (it checks keys and shapes only). The user replaces img01.png and rewrites img02's caption
    after the state of step 2, and the trainer is killed -9: the next attempt must train on neither the old
    picture's latents nor the old caption's encoding, so trainsup sets exactly those two caches aside in the
    run dir and the trainer makes them again; the image, the caption and the other caches are untouched."""
    dataset = sdxl_bed.user_data(tmp_path / "data")
    images = tmp_path / "data" / "images"
    out = tmp_path / "out"
    argv = sdxl_bed.command(out, dataset, "--cache_latents", "--cache_latents_to_disk",
                            "--cache_text_encoder_outputs", "--cache_text_encoder_outputs_to_disk")
    marks: dict[str, Any] = {}

    def edit_and_kill(event: dict[str, Any], pid: int) -> None:
        if event["event"] == "state_saved" and event["step"] == 2 and event["attempt"] == 1 and "killed" not in marks:
            marks["caches"] = {p.name: digest(p) for p in images.glob("*.npz")}
            (images / "img01.png").write_bytes((images / "img00.png").read_bytes())  # another picture, same size
            marks["image"] = digest(images / "img01.png")
            (images / "img02.txt").write_text("a green pyramid\n")
            trainer = trainer_pid(pid)
            assert trainer is not None
            subprocess.run(["kill", "-9", str(trainer)], check=True)
            marks["killed"] = trainer

    done = supervise(sdxl_bed, argv, out, tmp_path, edit_and_kill)
    finished_all_steps(done, out)
    assert "killed" in marks, "the trainer was never killed"
    assert sorted(marks["caches"]) == sorted([f"img{i:02d}_0064x0064_sdxl.npz" for i in range(4)]
                                             + [f"img{i:02d}_te_outputs.npz" for i in range(4)])
    assert [f["class"] for f in done.of("fault")] == ["host_oom_killed"]
    # The state of step 2 is mid-epoch (4 steps an epoch) and sd-scripts resumes exactly only from an epoch's
    # end: trainsup takes the run's start, the only exact point yet.
    starts = done.of("attempt_start")
    assert len(starts) == 2 and starts[1]["resume_from"] is None
    assert [e["epoch_end"] for e in done.of("resume_exact")] == [0]
    stale = [images / "img01_0064x0064_sdxl.npz", images / "img02_te_outputs.npz"]
    assert [sorted(e["files"]) for e in done.of("cache_invalidated")] == [[str(p) for p in stale]]
    for cache in stale:
        [kept] = (done.run_dir / "invalidated").glob(f"*/images/{cache.name}")
        assert digest(kept) == marks["caches"][cache.name]  # the old cache, set aside whole
        assert cache.is_file() and digest(cache) != marks["caches"][cache.name]  # made again
    for name, before in marks["caches"].items():
        if name not in {p.name for p in stale}:
            assert digest(images / name) == before, name
    assert digest(images / "img01.png") == marks["image"]
    assert (images / "img02.txt").read_text() == "a green pyramid\n"
    assert done.of("attempt_end")[1]["steps_trained"] == 6


def test_caches_the_trainer_refuses_with_its_augmentations_are_dropped_one_by_one_and_the_run_trains(
        sdxl_bed: SdxlBed, tmp_path: Path) -> None:
    """The dataset shuffles captions and crops at random, and the command caches text-encoder outputs and
    latents: sdxl_train_network.py refuses each pair with its own assertion before the model loads, latents
    first (~9 s an attempt). trainsup reads each as flag_conflict and drops the caching flag it names (never
    the user's augmentation): --cache_latents, then --cache_text_encoder_outputs; the third attempt trains
    every step."""
    dataset = sdxl_bed.user_data(tmp_path / "data")
    text = dataset.read_text().replace("shuffle_caption = false", "shuffle_caption = true\nrandom_crop = true")
    dataset.write_text(text)
    out = tmp_path / "out"
    steps = STEPS_PER_EPOCH
    done = supervise(sdxl_bed, sdxl_bed.command(out, dataset, "--cache_text_encoder_outputs", "--cache_latents",
                                                steps=steps), out, tmp_path)
    finished_all_steps(done, out, steps)
    assert [f["class"] for f in done.of("fault")] == ["flag_conflict", "flag_conflict"]
    logs = [(done.run_dir / f"attempt-{n}.log").read_text(encoding="utf-8", errors="replace") for n in (1, 2)]
    assert "when caching latents, either color_aug or random_crop cannot be used" in logs[0]
    assert "when caching Text Encoder output" in logs[1]
    assert [r["actions"] for r in done.of("remedy")] == [["remove --cache_latents"],
                                                         ["remove --cache_text_encoder_outputs"]]
    argv = done.of("attempt_start")[-1]["argv"]
    assert "--cache_text_encoder_outputs" not in argv and "--cache_latents" not in argv
    assert done.of("attempt_end")[-1]["steps_trained"] == steps
    assert "shuffle_caption = true\nrandom_crop = true" in dataset.read_text()
