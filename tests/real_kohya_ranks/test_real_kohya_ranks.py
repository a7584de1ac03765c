"""`trainsup run` over two real ranks of sd-scripts: ``train_textual_inversion.py`` under ``accelerate launch
--multi_gpu --num_processes 2`` with the gloo backend, on the CPU (accelerate's multi-GPU launcher is torch's
elastic agent; with no CUDA device each rank is a MULTI_CPU rank). OMP_NUM_THREADS=1: two ranks on two cores.

What the bed can and cannot run with two ranks, and why (sd-scripts 2026-02-16, accelerate 1.6.0, torch 2.13):
- ``train_network.py`` (a LoRA) cannot: ``RuntimeError: DistributedDataParallel is not needed when a module
  doesn't have any parameter that requires a gradient``, from ``accelerator.prepare(unet)`` on both ranks.
  Accelerate's MULTI_CPU branch of ``prepare_model`` wraps every model in DDP, while its MULTI_GPU branch skips a
  model without trainable parameters; the LoRA's U-Net and text encoder are frozen (the LoRA is a module of its
  own), so a LoRA runs with several ranks on GPUs only. ``--network_train_text_encoder_only
  --gradient_checkpointing`` fails the same way (sd-scripts makes the embeddings trainable after ``prepare``).
- ``train_textual_inversion.py`` can, with ``--ddp_static_graph`` (without it DDP stops at the second step:
  ``Expected to have finished reduction in the prior iteration``, the text encoder's unused parameters):
  8 images, batch 1 on each rank, 4 steps an epoch, 1.2 s a step, about 20 s from launch to the first step.
  Its states hold no ``train_state.json``, so its ``--resume`` counts steps from 0 again: trainsup starts such a
  run over from the beginning after a fault, moving the earlier attempt's saves into the run dir.

A rank killed -9: the whole tree stopped within seconds (measured), the run started over and ended as an
uninterrupted two-rank run. A rank stopped (SIGSTOP): a hang whose report names it as the straggler. A
rank-0-only phase longer than the collective timeout (``tests/real_ranks/rank_faults``): ``nccl_timeout``,
relaunched with ``--ddp_timeout`` raised, finished. A rank that fails on its own: ``trainsup diagnose`` names
its error, not the other rank's consequent one. Peak memory: about 7 GB a rank while the U-Net loads.
"""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import bare_ranks_run, safetensors_max_abs_diff, trainsup_cmd
from tests.e2e.demo_harness import SupervisedRun, supervise, visible_names
from tests.real.bed import Bed
from tests.real_ranks.test_real_hf_ranks import AtStep

FAULTS = Path(__file__).resolve().parent.parent / "real_ranks" / "rank_faults"
STEPS, SAVE_EVERY = 12, 4
POLICY = "backoff:\n  initial_s: 0.5\n  max_s: 1\nstop:\n  grace_s: 10\n"


def step_bar(step: int) -> str:
    """tqdm's bar once ``step`` of the run's steps are done."""
    return f" {step}/{STEPS} ["


def command(bed: Bed, out: Path, *extra: str) -> list[str]:
    r = bed.root
    return [str(r / "venv/bin/accelerate"), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
            "--mixed_precision", "no", "--dynamo_backend", "no", "--num_cpu_threads_per_process", "1",
            "train_textual_inversion.py", "--pretrained_model_name_or_path", str(r / "model"),
            "--tokenizer_cache_dir", str(r / "model/tokenizer_cache"),
            "--dataset_config", str(r / "data/dataset.toml"), "--output_dir", str(out), "--output_name", "tiny",
            "--save_model_as", "safetensors", "--token_string", "sks", "--init_word", "cat",
            "--num_vectors_per_token", "1", "--use_object_template", "--optimizer_type", "AdamW",
            "--learning_rate", "1e-4", "--ddp_static_graph", "--lr_scheduler", "constant",
            "--max_train_steps", str(STEPS), "--save_every_n_steps", str(SAVE_EVERY), "--save_state",
            "--mixed_precision", "no", "--save_precision", "float", "--max_data_loader_n_workers", "0",
            "--seed", "42", *extra]


def env(bed: Bed, **extra: str) -> dict[str, str]:
    return bed.env(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", COLUMNS="200", **extra)


@pytest.fixture(scope="module")
def reference(kohya_bed: Bed, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("kohya-ranks-reference") / "out"
    # the end's state and final weights are written last
    code, stderr = bare_ranks_run(command(kohya_bed, out), kohya_bed.sd_scripts, env(kohya_bed),
                                  lambda: (out / "tiny.safetensors").is_file() and (out / "tiny-state").is_dir())
    assert code == 0, stderr[-3000:]
    return out


def assert_as_uninterrupted(out: Path, reference: Path) -> None:
    names = visible_names(reference)
    assert names == ["tiny-state", *(f"tiny-step{s:08d}{kind}" for s in range(SAVE_EVERY, STEPS + 1, SAVE_EVERY)
                                     for kind in ("-state", ".safetensors")), "tiny.safetensors"], names
    assert visible_names(out) == names
    for rel in ("tiny.safetensors", f"tiny-step{STEPS:08d}.safetensors", "tiny-state/model.safetensors"):
        assert safetensors_max_abs_diff(out / rel, reference / rel) == 0.0, rel


def supervised(bed: Bed, out: Path, tmp: Path, policy: str, hook: AtStep | None = None, *extra: str,
               **env_extra: str) -> SupervisedRun:
    if hook is not None:
        hook.start()
    run = supervise(command(bed, out, *extra), out, tmp, env=env(bed, **env_extra), policy=policy, timeout=900,
                    cwd=bed.sd_scripts)
    if hook is not None:
        hook.join(5)
    return run


def test_rank_1_killed_stops_the_whole_tree_within_seconds_and_the_run_ends_as_an_uninterrupted_one(
        kohya_bed: Bed, reference: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    kill = AtStep(out, signal.SIGKILL, step_bar(6))  # after the saves of step 4
    run = supervised(kohya_bed, out, tmp_path, POLICY, kill)
    kill.assert_kill_stopped_the_tree(run, "sd-scripts", "kohya")
    assert [s["resume_step"] for s in run.of("attempt_start")] == [0, 0]  # its states cannot resume: over again
    # the first attempt's saves of step 4, kept in the run dir, out of the output dir's sight
    hidden = {Path(e["dir"]).name for e in run.of("save_hidden")}
    assert {"tiny-step00000004.safetensors", "tiny-step00000004-state"} <= hidden, hidden
    assert (out / ".trainsup" / "saves" / "tiny-step00000004.safetensors").is_file()
    assert_as_uninterrupted(out, reference)


def test_rank_1_stopped_is_a_hang_naming_it_the_straggler_then_the_run_ends_as_an_uninterrupted_one(
        kohya_bed: Bed, reference: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    stop = AtStep(out, signal.SIGSTOP, step_bar(2))
    policy = "backoff:\n  initial_s: 0.5\n  max_s: 1\nstop:\n  grace_s: 3\nhang:\n  min_timeout_s: 10\n"
    run = supervised(kohya_bed, out, tmp_path, policy, stop)
    report = stop.assert_hang_names_rank_1(run, "sd-scripts", 3)  # accelerate and both ranks, at least
    # rank 0 waits for it in a collective of DDP's; which one depends on when rank 1 stopped: the sync before
    # the next forward (_pre_forward, or the buffers' broadcast inside it) or the gradients' all-reduce in the
    # backward (seen all three)
    assert re.search(r"ranks: rank 0 in (DistributedDataParallel\.\w+|the backward's gradient all-reduce "
                     r"\(_engine_run_backward\)), rank 1 stopped: rank 1 is the straggler", report), report[:600]
    assert_as_uninterrupted(out, reference)


def test_a_rank_0_save_longer_than_the_collective_timeout_is_fixed_by_a_longer_ddp_timeout(
        kohya_bed: Bed, reference: Path, tmp_path: Path) -> None:
    """``--ddp_timeout 1`` (a minute, sd-scripts' smallest); rank 0's first weights file takes 80 s more."""
    out = tmp_path / "out"
    run = supervised(kohya_bed, out, tmp_path, POLICY, None, "--ddp_timeout", "1",
                     PYTHONPATH=str(FAULTS), TRAINSUP_TEST_SLOW_SAVE_S="80", TRAINSUP_TEST_DDP_TIMEOUT_UNIT_S="60")
    assert run.returncode == 0, run.stderr[-3000:]
    (fault,) = run.of("fault")
    assert fault["class"] == "nccl_timeout", fault
    (remedy,) = run.of("remedy")
    assert any(a.startswith("--ddp_timeout 4 (was 1)") for a in remedy["actions"]), remedy
    first, second = (s["argv"] for s in run.of("attempt_start"))
    assert first[first.index("--ddp_timeout") + 1] == "1" and second[second.index("--ddp_timeout") + 1] == "4"
    starts, ends = run.of("attempt_start"), run.of("attempt_end")
    print(f"sd-scripts attempt 1 (--ddp_timeout 1) launch -> its end on nccl_timeout: "
          f"{ends[0]['ts'] - starts[0]['ts']:.1f} s; attempt 2 (--ddp_timeout 4) launch -> finished: "
          f"{ends[-1]['ts'] - starts[-1]['ts']:.1f} s")
    assert_as_uninterrupted(out, reference)


def test_diagnose_names_the_rank_that_failed_first_not_the_others_consequent_errors(
        kohya_bed: Bed, tmp_path: Path) -> None:
    """Rank 1 raises at its third step; rank 0, waiting for it in the gradient all-reduce, fails in turn (gloo:
    ``Connection closed by peer``), and accelerate's launcher reports both. The log is the trainer's own."""
    out, log = tmp_path / "out", tmp_path / "two-ranks.log"
    with log.open("w") as sink:
        done = subprocess.run(command(kohya_bed, out), cwd=kohya_bed.sd_scripts, stdout=sink,
                              stderr=subprocess.STDOUT, timeout=600, check=False,
                              env=env(kohya_bed, PYTHONPATH=str(FAULTS), TRAINSUP_TEST_FAIL_AT="1:3"))
    assert done.returncode != 0
    text = log.read_text(errors="replace")
    assert "[rank0]: RuntimeError" in text and "Connection closed by peer" in text  # the consequence is there
    said = subprocess.run(trainsup_cmd("diagnose", str(log)), capture_output=True, text=True, timeout=60,
                          check=False)
    assert said.returncode == 0, said.stderr
    assert "evidence: [rank1]: ValueError: rank 1: a sample this rank cannot train on, at step 3" in said.stdout, \
        said.stdout
