"""`trainsup run` over diffusers' real example trainer (``train_text_to_image_lora.py``, a LoRA on a tiny
SD pipeline, on the CPU; 8 steps an epoch, 20 steps, a checkpoint every 5 or 4).

- a training process killed -9 two steps after ``checkpoint-10`` (mid-epoch): trainsup restarts from
  step 0, the run's own epoch start, since the script resumes exactly only from an epoch's end: the
  uninterrupted run's names and final LoRA bit for bit;
- with a checkpoint every 4, killed two steps after ``checkpoint-12``: resumed from ``checkpoint-8``, an
  epoch's end, by name: bit for bit again;
- the newest checkpoint cut mid-save (its last file missing, which the script itself would load without
  a word) is set aside under the run dir, and the resume names the newest complete one;
- ``--checkpoints_total_limit 1`` (the script deletes before it saves) killed inside the last save: the
  limit trainsup raised to 2 left ``checkpoint-15``, resumed from, within the measured residual;
- killed inside the write of its final LoRA (safetensors' temporary ``.tmpXXXXXX`` left in the output
  dir): resumed from ``checkpoint-15``, the run ends with the uninterrupted run's names, the temporary
  file moved into the run dir;
- a finished run started again trains nothing and leaves its final weights untouched.

The user's command is passed unchanged but for what trainsup says it changed; every assertion is about
what the real trainer printed and wrote. One trainer at a time.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import script_process, trainsup_cmd
from tests.e2e.demo_harness import SupervisedRun, digest_tree, supervise
from tests.real_diffusers.bed import RESIDUAL, SCRIPT, DiffusersBed

POLICY = "backoff:\n  initial_s: 0.5\n  max_s: 1\nstop:\n  grace_s: 10\n"
FINAL = "pytorch_lora_weights.safetensors"
STATE_FILES = ["optimizer.bin", FINAL, "random_states_0.pkl", "scheduler.bin"]


def visible(out: Path) -> list[str]:
    """The names the output dir shows (the tensorboard logs aside: every launch adds files there)."""
    return sorted(p.name for p in out.iterdir() if p.name not in (".trainsup", "logs"))


def reference_run(bed: DiffusersBed, where: Path, *extra: str, every: int = 5) -> Path:
    out = where / "out"
    where.mkdir(parents=True, exist_ok=True)
    done = bed.run_plain(bed.command(out, *extra, every=every), where)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def reference(diffusers_bed: DiffusersBed, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted bare run of the bed's command (a checkpoint every 5)."""
    out = reference_run(diffusers_bed, tmp_path_factory.mktemp("diffusers-ref5"))
    assert visible(out) == ["checkpoint-10", "checkpoint-15", "checkpoint-20", "checkpoint-5", FINAL]
    return out


def killer(out: Path, pid: Callable[[], int], when: Callable[[], bool], marks: dict[str, object]) -> threading.Thread:
    """A thread that kill -9s the training process (accelerate's child, as the OOM killer would) of attempt
    1 the moment ``when()`` holds, and keeps a digest of the output dir as the kill left it."""

    def watch() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if when():
                trainer = script_process(pid(), SCRIPT)
                if trainer is not None:
                    trainer.kill()
                    trainer.wait(timeout=60)
                    marks["digest"] = digest_tree(out)
                    return
            time.sleep(0.0005)
    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def bar_reached(out: Path, step: int, total: int = 20) -> Callable[[], bool]:
    """Attempt 1's log shows the ``Steps:`` bar at ``step`` or later."""
    log = out / ".trainsup" / "attempt-1.log"
    pattern = re.compile(rf"\| ({'|'.join(str(s) for s in range(step, total + 1))})/{total} ".encode())

    def seen() -> bool:
        try:
            return pattern.search(log.read_bytes()) is not None
        except OSError:
            return False
    return seen


def supervise_killed(bed: DiffusersBed, out: Path, tmp: Path, when: Callable[[], bool], marks: dict[str, object],
                     *extra: str, every: int = 5) -> SupervisedRun:
    """`trainsup run` over the bed's command, its training process killed once ``when()`` holds."""
    from trainsup.demo.story import follow
    from trainsup.record.journal import read_events

    policy = tmp / "policy.yaml"
    policy.write_text(POLICY)
    proc = subprocess.Popen(trainsup_cmd("run", "--quiet", "--policy", str(policy), "--",
                                         *bed.command(out, *extra, every=every)),
                            cwd=tmp, env=bed.env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    thread = killer(out, lambda: proc.pid, when, marks)
    try:
        follow(proc, out / ".trainsup", lambda _e: None, timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
        stderr = proc.stderr.read() if proc.stderr else ""
        proc.wait()
    thread.join(timeout=5)
    return SupervisedRun(proc.returncode, "", stderr, read_events(out / ".trainsup"), out / ".trainsup")


def trained_steps(run_dir: Path, attempt: int) -> list[int]:
    """The steps an attempt's bar showed, in order (each redraw once)."""
    text = (run_dir / f"attempt-{attempt}.log").read_bytes().decode(errors="replace")
    seen: list[int] = []
    for m in re.finditer(r"Steps:\s+\d+%\|[^|]*\|\s*(\d+)/20", text):
        if not seen or int(m.group(1)) != seen[-1]:
            seen.append(int(m.group(1)))
    return seen


def test_killed_two_steps_after_checkpoint_10_restarts_at_the_runs_epoch_start_bit_for_bit(
        diffusers_bed: DiffusersBed, reference: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    marks: dict[str, object] = {}
    done = supervise_killed(diffusers_bed, out, tmp_path, bar_reached(out, 12), marks)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "digest" in marks, "the trainer was never killed"
    assert len(done.of("attempt_start")) == 2 and [f["class"] for f in done.of("fault")] == ["host_oom_killed"]
    # checkpoint-10 is mid-epoch (8 steps an epoch): the newest epoch end is the run's start, within two
    # checkpoint intervals, so attempt 2 starts from step 0 with the uninterrupted run's data order.
    exact = done.of("resume_exact")
    assert exact and exact[-1]["step"] == 10 and exact[-1]["epoch_end"] == 0
    second = done.of("attempt_start")[1]["argv"]
    assert "--resume_from_checkpoint" not in second
    assert trained_steps(done.run_dir, 2)[-1] == 20 and max(trained_steps(done.run_dir, 2)) == 20
    assert visible(out) == visible(reference)
    for name in visible(reference):
        path = out / name / FINAL if name.startswith("checkpoint-") else out / name
        assert diffusers_bed.max_abs_diff(path, reference / path.relative_to(out)) == 0.0, name
    assert done.of("finished")[0]["final_weights"] == str(out / FINAL)


def test_killed_after_checkpoint_12_resumes_from_the_epoch_end_checkpoint_8_bit_for_bit(
        diffusers_bed: DiffusersBed, tmp_path: Path) -> None:
    ref = reference_run(diffusers_bed, tmp_path / "ref4", every=4)
    out = tmp_path / "out"
    marks: dict[str, object] = {}
    done = supervise_killed(diffusers_bed, out, tmp_path, bar_reached(out, 14), marks, every=4)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "digest" in marks, "the trainer was never killed"
    second = done.of("attempt_start")[1]["argv"]
    assert second[second.index("--resume_from_checkpoint") + 1] == "checkpoint-8"
    steps = trained_steps(done.run_dir, 2)
    assert steps[0] == 8 and steps[-1] == 20 and 21 not in steps
    assert visible(out) == visible(ref) == ["checkpoint-12", "checkpoint-16", "checkpoint-20", "checkpoint-4",
                                            "checkpoint-8", FINAL]
    assert diffusers_bed.max_abs_diff(out / FINAL, ref / FINAL) == 0.0
    # checkpoint-12, written before the kill and past the resume point, is set aside, not deleted
    assert (done.run_dir / "set-aside" / "attempt-2" / "checkpoint-12" / "random_states_0.pkl").is_file()


def test_a_newest_checkpoint_cut_mid_save_is_set_aside_and_the_resume_names_the_newest_complete_one(
        diffusers_bed: DiffusersBed, reference: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    for name in ("checkpoint-5", "checkpoint-10"):
        shutil.copytree(reference / name, out / name)
    # the last file of the save: without it the script's own `latest` loads checkpoint-10 without a word
    (out / "checkpoint-10" / "random_states_0.pkl").unlink()
    done = supervise(diffusers_bed.command(out, "--resume_from_checkpoint", "latest"), out, tmp_path,
                     env=diffusers_bed.env(), policy=POLICY, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    argv = done.of("attempt_start")[0]["argv"]
    assert argv[argv.index("--resume_from_checkpoint") + 1] == "checkpoint-5"
    aside = done.run_dir / "set-aside" / "attempt-1" / "checkpoint-10"
    assert aside.is_dir() and not (aside / "random_states_0.pkl").exists()
    assert visible(out) == visible(reference)
    assert trained_steps(done.run_dir, 1)[0] == 5 and max(trained_steps(done.run_dir, 1)) == 20
    worst = diffusers_bed.max_abs_diff(out / FINAL, reference / FINAL)
    print(f"diffusers resumed mid-epoch from checkpoint-5: max |dw| {worst:.3g}")
    assert worst <= RESIDUAL


def test_a_kill_inside_the_save_under_checkpoints_total_limit_1_still_resumes(
        diffusers_bed: DiffusersBed, reference: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    marks: dict[str, object] = {}
    done = supervise_killed(diffusers_bed, out, tmp_path, lambda: (out / "checkpoint-20").is_dir(), marks,
                            "--checkpoints_total_limit", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "digest" in marks, "the trainer was never killed"
    first, second = (a["argv"] for a in done.of("attempt_start"))
    assert first[first.index("--checkpoints_total_limit") + 1] == "2"
    # the script deleted checkpoint-10 before it began checkpoint-20; checkpoint-15 stayed to resume from
    assert second[second.index("--resume_from_checkpoint") + 1] == "checkpoint-15"
    assert visible(out) == ["checkpoint-15", "checkpoint-20", FINAL]
    worst = diffusers_bed.max_abs_diff(out / FINAL, reference / FINAL)
    print(f"diffusers resumed mid-epoch from checkpoint-15: max |dw| {worst:.3g}")
    assert worst <= RESIDUAL


def test_killed_inside_the_write_of_its_final_weights_ends_with_the_uninterrupted_runs_files(
        diffusers_bed: DiffusersBed, reference: Path, tmp_path: Path) -> None:
    """safetensors writes the final LoRA as ``out/.tmpXXXXXX``, then renames it; a kill inside that write
    (``final_write_kill/sitecustomize.py``) leaves the temporary file in the output dir. The resumed run
    must end with the uninterrupted run's names, the half-written file kept in the run dir."""
    out = tmp_path / "out"
    shim = Path(__file__).parent / "final_write_kill"
    env = diffusers_bed.env(PYTHONPATH=os.pathsep.join(filter(None, [str(shim), os.environ.get("PYTHONPATH")])),
                            TRAINSUP_TEST_KILL_FINAL_OUT=str(out),
                            TRAINSUP_TEST_KILL_FINAL_MARK=str(tmp_path / "killed"))
    done = supervise(diffusers_bed.command(out), out, tmp_path, env=env, policy=POLICY, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "killed").exists(), "the final write was never killed"
    assert [f["class"] for f in done.of("fault")] == ["host_oom_killed"]
    second = done.of("attempt_start")[1]["argv"]
    assert second[second.index("--resume_from_checkpoint") + 1] == "checkpoint-15"  # never the state at the end
    # checkpoint-20 is set aside too: the resumed attempt writes that name again
    assert sorted(Path(e["dir"]).name[:4] for e in done.of("state_set_aside")) == [".tmp", "chec"]
    aside = [e for e in done.of("state_set_aside") if Path(e["dir"]).name.startswith(".tmp")]
    assert Path(aside[0]["dir"]).parent == out and "write cut short" in aside[0]["why"]
    assert Path(aside[0]["to"]).is_file() and Path(aside[0]["to"]).parent == done.run_dir / "set-aside" / "attempt-2"
    assert visible(out) == visible(reference)
    worst = diffusers_bed.max_abs_diff(out / FINAL, reference / FINAL)
    print(f"diffusers killed inside its final write, resumed from checkpoint-15: max |dw| {worst:.3g}")
    assert worst <= RESIDUAL


def test_a_finished_run_started_again_trains_nothing_and_leaves_its_final_weights(
        diffusers_bed: DiffusersBed, reference: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    shutil.copytree(reference, out)
    before = digest_tree(out)
    # finished without trainsup: the script's own `latest` would train a step 21 over the final weights
    argv = diffusers_bed.command(out, "--resume_from_checkpoint", "latest")
    done = subprocess.run(trainsup_cmd("run", "--", *argv), cwd=tmp_path, env=diffusers_bed.env(),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    assert "this run is finished" in done.stderr and "Traceback" not in done.stderr
    assert digest_tree(out) == before
    # finished under trainsup: the same command once more is told so, exit 0, nothing launched
    again = tmp_path / "again"
    again.mkdir()
    first = supervise(diffusers_bed.command(again / "out"), again / "out", again, env=diffusers_bed.env(),
                      policy=POLICY, timeout=600, cwd=again)
    assert first.returncode == 0, first.stderr[-3000:]
    before = digest_tree(again / "out")
    for extra in ((), ("--resume_from_checkpoint", "latest")):
        rerun = subprocess.run(trainsup_cmd("run", "--", *diffusers_bed.command(again / "out", *extra)), cwd=again,
                               env=diffusers_bed.env(), capture_output=True, text=True, timeout=120, check=False)
        assert rerun.returncode == 0, rerun.stderr
        assert "Nothing is trained again" in rerun.stderr + rerun.stdout
        assert digest_tree(again / "out") == before
        assert not (again / "out" / ".trainsup" / "attempt-2.log").exists()


def test_a_flag_whose_package_is_missing_is_dropped_and_the_run_trains(
        diffusers_bed: DiffusersBed, reference: Path, tmp_path: Path) -> None:
    """A command copied from a GPU box: --enable_xformers_memory_efficient_attention without xformers (the
    bed has none) stops the script before its first step; the next launch runs without the flag."""
    out = tmp_path / "out"
    argv = diffusers_bed.command(out, "--enable_xformers_memory_efficient_attention")
    done = supervise(argv, out, tmp_path, env=diffusers_bed.env(), policy=POLICY, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [f["class"] for f in done.of("fault")] == ["flag_conflict"]
    assert "xformers is not available" in done.of("fault")[0]["evidence"]
    first, second = (a["argv"] for a in done.of("attempt_start"))
    assert "--enable_xformers_memory_efficient_attention" in first
    assert second == [a for a in first if a != "--enable_xformers_memory_efficient_attention"]
    # PyTorch's own attention, the rest of the command as given: the uninterrupted run's weights
    assert visible(out) == visible(reference)
    assert diffusers_bed.max_abs_diff(out / FINAL, reference / FINAL) == 0.0
