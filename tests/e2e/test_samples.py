"""Samples as if the run had never been interrupted: the demo trainer (which counts its sample steps as
sd-scripts does, from 0 again after a resume) samples every 10 of 40 steps, is killed -9 between two
samples, and the output dir's sample/ ends with the uninterrupted run's samples, at the same steps and
under the same names (the timestamps aside), none under an attempt's own name; the page places them
at their true steps; the resumed attempts write no state at every step."""

from __future__ import annotations

import re
import signal
from pathlib import Path

from tests.e2e.demo_harness import clean_env, demo_argv, run_plain, supervise, visible_names
from tests.e2e.test_resilience import trainer_processes
from trainsup.web.files import sample_files

STAMP = re.compile(r"_\d{14}(?=(?:_\d+)?\.png$)")


def samples_shown(out: Path) -> list[str]:
    """The sample images in ``out/sample``, their timestamps taken out (each run has its own)."""
    return sorted(STAMP.sub("", p.name) for p in (out / "sample").glob("*.png"))


def test_samples_fall_on_the_uninterrupted_runs_steps_under_its_names(assets: dict[str, Path], tmp_path: Path) -> None:
    extra = ("--sample_prompts", str(assets["prompts"]), "--sample_every_n_steps", "10")
    ref = tmp_path / "reference"
    r = run_plain(demo_argv("train_network", assets, ref, *extra, steps=40))
    assert r.returncode == 0, r.stderr[-2000:]
    prompts = len(samples_shown(ref)) // 4
    assert sorted({name[:11] for name in samples_shown(ref)}) == [f"lora_{s:06d}" for s in (10, 20, 30, 40)]

    out = tmp_path / "out"
    killed: list[int] = []

    def kill_after_step_12(event: dict) -> None:
        # after the sample of step 10 and the state of 12 (an epoch's end: 4 steps an epoch), before step 20
        if event["event"] == "state_saved" and event["step"] == 12 and not killed:
            for proc in trainer_processes(out):
                proc.send_signal(signal.SIGKILL)
                killed.append(proc.pid)

    run = supervise(demo_argv("train_network", assets, out, *extra, steps=40), out, tmp_path,
                    env=clean_env(TRAINSUP_DEMO_STEP_SECONDS="0.1"), on_event=kill_after_step_12)
    assert run.returncode == 0, run.stderr[-3000:]
    assert killed and [f["class"] for f in run.of("fault")] == ["host_oom_killed"]
    starts = run.of("attempt_start")
    assert starts[1]["resume_step"] == 12 and "--sample_at_first" not in starts[1]["argv"]
    # One sample cadence from 12 would be 2 (labels 8, 18, 28): the attempt goes to step 28 sampling
    # every 8 labels, and is relaunched from the end of epoch 7 without spending the restart budget.
    argv = starts[1]["argv"]
    assert argv[argv.index("--sample_every_n_steps") + 1] == "8"
    relaunch = run.of("segment_relaunch")
    assert [e["step"] for e in relaunch] == [28] and len(run.of("remedy")) == 1
    assert starts[2]["resume_step"] == 28 and not [e for e in run.of("fault") if e["attempt"] == 2]

    assert samples_shown(out) == samples_shown(ref)
    assert not [p.name for p in (out / "sample").iterdir() if "trainsup" in p.name]
    assert sorted(e["step"] for e in run.of("sample_published")) == [20] * prompts + [30] * prompts + [40] * prompts
    assert visible_names(out) == visible_names(ref)
    # The page reads the names as true steps (run_start's samples record).
    spec = run.of("run_start")[0]["samples"]
    assert spec["absolute_steps"] is True
    found = sample_files([Path(d) for d in spec["dirs"]], re.compile(spec["step_pattern"]))
    assert sorted({f.label for f in found}) == [10, 20, 30, 40]

    # Saves: a save every 4 steps falls on every epoch's end here; after step 12 the uninterrupted run
    # writes 7 step states, 6 epoch states (not at the last epoch's end) and the final state.
    resumed = [e for e in run.of("state_saved") if e["attempt"] > 1]
    assert len(resumed) <= 7 + 6 + 1 + 2, [e["step"] for e in resumed]
