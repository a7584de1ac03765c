"""What trainsup promises for every trainer behind an adapter, on each bed's real trainer.

Written once, parametrized over the beds (``beds.BEDS``): a clean run finishes clean; a trainer
killed -9 after its state of step 10 resumes from the newest state its adapter can resume exactly
from (``Bed.resume_point``; or, where it cannot resume, restarts as its adapter says), nothing it
had written changes, and the attempts after it write at most ``Bed.resumed_extra_states`` states more
than an uninterrupted run does after that point; a state cut mid-save is never resumed from; a
fault trainsup can fix is fixed through the next launch; ``diagnose`` agrees with the journal; and a
SIGTERM to trainsup ends it with 143 and leaves none of the trainer's processes behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from tests.behaviour.beds import Bed, cmdline
from tests.behaviour.harness import POLICY, Ctx, Run, changed_since, digest_tree, supervise, trainsup_args
from tests.conftest import diagnose_json as diagnose
from tests.conftest import trainsup_cmd


def assert_finished(run: Run) -> None:
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.events[-1]["event"] == "finished", run.events[-1]


def test_a_clean_run_finishes_with_no_fault(bed: Bed, clean_run: Run) -> None:
    assert_finished(clean_run)
    assert not clean_run.of("fault") and len(clean_run.starts()) == 1
    steps = [s["step"] for s in clean_run.of("state_saved")]
    assert {bed.at(5), bed.at(10), bed.at(15), bed.at(20)} <= set(steps), steps
    bed.check_clean(clean_run)


def test_a_killed_trainer_resumes_from_its_newest_complete_state_and_nothing_it_wrote_changes(
        bed: Bed, killed_run: Run) -> None:
    run = killed_run
    assert "killed" in run.marks, "the trainer was never killed: no state_saved of step 10 in attempt 1"
    assert_finished(run)
    assert run.faults() == ["host_oom_killed"]  # a kill -9 reads as the kernel's OOM killer's
    start = run.starts()[1]  # the attempt after the kill (sd-scripts: relaunched at an epoch's end later)
    if run.launch.resumes:
        assert (start["resume_from"], start["resume_step"]) == bed.resume_point(run, bed.at(10))
    else:
        assert (start["resume_from"], start["resume_step"]) == (None, 0)
    changed = changed_since(run.marks["digest"], run)
    assert not changed, f"changed or gone since the kill: {changed}"
    bed.check_killed(run)


def test_a_state_cut_mid_save_is_never_resumed_from(bed: Bed, cut_run: Run) -> None:
    run = cut_run
    assert "killed" in run.marks, "the trainer was never killed: no state_saved of step 10 in attempt 1"
    assert_finished(run)
    cut = str(bed.state_dir(run.out, bed.at(10)))
    assert cut not in [s["resume_from"] for s in run.starts()]
    start = run.starts()[1]
    if run.launch.resumes:
        assert (start["resume_from"], start["resume_step"]) == bed.resume_point(run, bed.at(5))
    else:
        assert (start["resume_from"], start["resume_step"]) == (None, 0)
    bed.check_cut(run)


def visible_files(out: Path, bed: Bed) -> list[str]:
    """What the user sees in the output dir: every file's path in it, trainsup's run dir and the
    trainer's log folders left out, each as the bed compares names (a sample's time of day left out)."""
    return sorted(bed.comparable(str(p.relative_to(out))) for p in out.rglob("*")
                  if p.is_file() and not p.relative_to(out).parts[0].startswith(".trainsup")
                  and p.relative_to(out).parts[0] not in bed.log_dirs)


@pytest.mark.parametrize("which", ["killed_run", "cut_run", "seeded_between_saves_run", "seeded_inside_a_save_run"])
def test_an_interrupted_run_ends_as_if_it_had_never_been_interrupted(
        bed: Bed, clean_run: Run, which: str, request: pytest.FixtureRequest) -> None:
    """The same files as the uninterrupted run, each weights file with its tensors (within the
    adapter's stated residual), and exactly the steps asked for; the seeded kills (at a step drawn
    from TRAINSUP_KILL_SEED, between saves or inside one) also never show a step past the last one
    asked for, nor one before the resume point once resumed."""
    run: Run = request.getfixturevalue(which)
    assert "killed" in run.marks, f"the trainer was never killed: {run.marks.get('kill') or which}"
    assert_finished(run)
    if "status_steps" in run.marks:
        resumed = [step for attempt, step in run.marks["status_steps"] if attempt >= 2]
        resume_step = run.starts()[1]["resume_step"]
        assert resumed and resume_step <= min(resumed) and max(resumed) <= bed.at(20), (resume_step, resumed)
        print(f"{bed.name}: killed {run.marks['kill']}: resumed at {resume_step}")
    assert visible_files(run.out, bed) == visible_files(clean_run.out, bed)
    start, end = run.starts()[-1], run.of("attempt_end")[-1]
    last = bed.at(20)
    assert start["resume_step"] + end["steps_trained"] == last and max(e["step"] for e in run.of("attempt_end")) == last
    worst = 0.0
    for path in bed.weights_files(clean_run.out):
        ours = run.out / path.relative_to(clean_run.out)
        a, b = bed.load_weights(ours), bed.load_weights(path)
        assert sorted(a) == sorted(b), ours
        worst = max([worst, *(float(np.max(np.abs(a[k].astype(np.float64) - b[k]))) for k in a)])
    assert worst <= bed.resume_tolerance, f"max |dw| {worst:.3g} over {bed.resume_tolerance:.3g}"
    print(f"{bed.name} {which}: max |dw| {worst:.3g} against the uninterrupted run")


def test_the_resumed_attempts_write_few_states_more_than_the_uninterrupted_run(
        bed: Bed, clean_run: Run, killed_run: Run) -> None:
    """Killed after the state of step 10: the states the attempts after the kill write (``state_saved``
    of attempts 2, 3, ...) against the uninterrupted run's after the resume step: at most the bed's
    ``resumed_extra_states`` more (sd-scripts: its resumed labels need a cadence of their own)."""
    run = killed_run
    assert "killed" in run.marks, "the trainer was never killed: no state_saved of step 10 in attempt 1"
    resume_step = run.starts()[1]["resume_step"]
    resumed = [e["step"] for e in run.of("state_saved") if e["attempt"] > 1]
    clean = [e["step"] for e in clean_run.of("state_saved") if e["step"] > resume_step]
    print(f"{bed.name}: resumed at {resume_step}, the attempts after the kill wrote {len(resumed)} states "
          f"{resumed}, the uninterrupted run {len(clean)} after that step {clean}")
    assert len(resumed) <= len(clean) + bed.resumed_extra_states, (resumed, clean)


def test_a_fault_trainsup_can_fix_is_fixed_in_the_next_launch(bed: Bed, remedy_run: Run) -> None:
    run = remedy_run
    assert run.faults(1) == [bed.remedy_fault], run.of("fault")
    remedies = [r for r in run.of("remedy") if r["class"] == bed.remedy_fault]
    assert remedies and remedies[0]["actions"], run.of("remedy")
    first, second = run.starts()[:2]
    assert (first["argv"], first["env"]) != (second["argv"], second["env"])  # the fix is in the launch
    assert_finished(run)
    bed.check_remedy(run)


@pytest.mark.parametrize("which", ["killed_run", "remedy_run"])
def test_diagnose_names_the_fault_the_journal_names(bed: Bed, which: str, request: pytest.FixtureRequest) -> None:
    run: Run = request.getfixturevalue(which)
    journaled = run.of("fault")[0]
    assert journaled["attempt"] == 1
    offline = diagnose(run.log(1))
    # A trainer killed outright prints nothing about it: then the run's journal beside the log says.
    assert offline["fault"] == journaled["class"], offline


def test_sigterm_to_trainsup_exits_143_and_leaves_none_of_the_trainers_processes(bed: Bed, sigterm_run: Run) -> None:
    run = sigterm_run
    assert run.marks.get("tree"), "trainsup was never signalled while the trainer trained"
    assert run.returncode == 143, run.stderr[-3000:]
    assert run.events[-1]["event"] == "gave_up" and run.events[-1]["exit_code"] == 143, run.events[-1]
    alive = [p for p in run.marks["tree"] if _running(p)]
    pattern = bed.process_pattern(run.out)
    assert any(pattern.search(" ".join(argv)) for argv in run.marks["argvs"]), run.marks["argvs"]  # the pattern works
    matching = [p for p in psutil.process_iter() if pattern.search(" ".join(cmdline(p)))]
    assert not alive and not [p for p in matching if _running(p)], [cmdline(p) for p in alive + matching]


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False



def test_the_same_command_after_it_finished_trains_nothing_and_changes_no_file(bed: Bed, clean_run: Run) -> None:
    """A finished run started again (a project queued twice, a unit restarted) is never trained over:
    trainsup says where its weights are, exits 0, and no file of the output dir changes."""
    tmp = clean_run.out.parent
    launch = bed.launch("clean", clean_run.out, tmp)
    before = digest_tree(clean_run.out)
    logs = sorted(clean_run.run_dir.glob("attempt-*.log"))
    (tmp / "again").mkdir(exist_ok=True)
    again = subprocess.run(trainsup_cmd("run", "--quiet", *trainsup_args(launch, tmp / "again", POLICY)),
                           cwd=launch.cwd, env=launch.env, capture_output=True, text=True, timeout=300, check=False)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "this run finished" in again.stderr and "--fresh" in again.stderr, again.stderr[-2000:]
    assert digest_tree(clean_run.out) == before
    assert sorted(clean_run.run_dir.glob("attempt-*.log")) == logs


@pytest.mark.parametrize("which", ["sigterm_run", "gave_up_run"])
def test_another_run_in_the_same_output_dir_never_resumes_the_first_or_touches_its_files(
        bed: Bed, which: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """The first run stopped (SIGTERM, as Ctrl-C; or given up after a kill with no restart allowed) with
    its states in the output dir; a second run with another output name and network size there: it
    trains from step 0 in a run dir of its own (a trainer without output names, whose saves would land
    on the first's, is refused), and every file of the first stays byte-identical."""
    first: Run = request.getfixturevalue(which)
    if which == "gave_up_run":
        assert first.returncode == 3 and first.events[-1]["event"] == "gave_up", first.stderr[-3000:]
    before = digest_tree(first.out)
    launch, own_dir = bed.other_run(first.out, tmp_path)
    if own_dir is None:  # the second run's saves would land on the first's names: refused, nothing made
        tmp_path.mkdir(parents=True, exist_ok=True)
        refused = subprocess.run(trainsup_cmd("run", "--quiet", *trainsup_args(launch, tmp_path, POLICY)),
                                 cwd=launch.cwd, env=launch.env, capture_output=True, text=True, timeout=300,
                                 check=False)
        assert refused.returncode == 2, refused.stderr[-3000:]
        assert "already lie under this run's output names" in refused.stderr, refused.stderr[-2000:]
    else:
        def stop_after_first_state(event: dict[str, Any], ctx: Ctx) -> None:
            if event["event"] == "state_saved" and "stopped" not in ctx.marks:
                ctx.marks["stopped"] = event
                os.kill(ctx.pid, signal.SIGTERM)

        second = supervise(launch, first.out, tmp_path, stop_after_first_state, run_dir=first.out / own_dir)
        assert second.returncode == 143, second.stderr[-3000:]
        assert "holds another run" in second.stderr, second.stderr[-3000:]
        start = second.starts()[0]
        assert (start["resume_from"], start["resume_step"]) == (None, 0), start
        saved = second.marks["stopped"]
        assert saved["attempt"] == 1 and saved["step"] == bed.at(5), saved
        assert str(first.out / ".trainsup") not in {s["resume_from"] for s in second.starts()}
    now = digest_tree(first.out)
    assert {k: now.get(k) for k in before} == before, "the first run's files changed"
