"""A short seeded chaos soak: `benchmarks/chaos.py` over five runs, one for each fault kind first
(trainer SIGKILL, supervisor SIGKILL, SIGSTOP past the hang timeout, a full disk, a mid-run edit),
plus what each run's seed adds. Every invariant the benchmark checks must hold: final weights equal
to an uninterrupted run's, no earlier file changed, resumes only from complete states, no orphan or
second trainer, a journal that ends `finished`, no traceback of trainsup's own. A failure prints the
run's seed; `python benchmarks/chaos.py --replay SEED` replays that run alone.

A second, single run puts the full disk under the journal (issue 29): not a byte left once the
journal's last block is nearly full, trainsup SIGKILLed and started again on the disk, which a
second writer keeps full. The new supervisor's records overflow that block, so one of its writes is
cut part-way; no line may be cut or glued onto another, and its end must be journaled (from the
journal's reserve) before the benchmark gives the space back and the run finishes."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

RUNS, SEED = 5, 3
KINDS = ("kill_trainer", "kill_supervisor", "freeze", "disk_full", "edit")
JOURNAL_SEED = 6  # with --kinds disk_full: one disk_full "under the journal" at step 1.7


def test_a_seeded_chaos_soak_keeps_every_invariant() -> None:
    done = subprocess.run([sys.executable, "benchmarks/chaos.py", "--runs", str(RUNS), "--seed", str(SEED), "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    report = done.stdout.strip().splitlines()
    # the last line is the one JSON object; without it the soak itself stopped: what it said
    assert report and report[-1].startswith("{"), \
        f"exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    summary = json.loads(report[-1])
    assert summary["violations"] == 0, "\n".join(report[:-1]) + done.stderr[-3000:]
    assert done.returncode == 0, done.stderr[-3000:]
    assert summary["runs"] == RUNS and len(summary["run_seeds"]) == RUNS
    assert summary["violation_list"] == [] and set(summary["violations_by_invariant"]) == set("123456")
    assert set(summary["kinds"]) | set(summary["skipped_kinds"]) == set(KINDS)
    for kind, row in summary["kinds"].items():
        assert row["injections"] >= 1, f"{kind} was never injected"
        assert row["violations"] == 0
    assert summary["injections"] == sum(row["injections"] for row in summary["kinds"].values())
    for row in summary["kinds"].values():
        assert all(isinstance(row[k], int) for k in ("runs", "steps_redone", "steps_since_state", "restarts"))


def test_a_full_disk_under_the_journal_cuts_no_line_and_the_end_is_journaled() -> None:
    done = subprocess.run([sys.executable, "benchmarks/chaos.py", "--kinds", "disk_full", "--replay", str(JOURNAL_SEED),
                           "--keep", "--json"], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    kept = re.search(r"^work dir kept: (.+)$", done.stdout, re.MULTILINE)
    work = Path(kept.group(1)) if kept else None
    try:
        if "disk_full skipped" in done.stderr:
            why = done.stderr.strip().splitlines()[-1]
            if os.environ.get("CI"):
                pytest.fail(f"{why}: CI must run the full-disk case (as root, where mount -t tmpfs works)")
            pytest.skip(why)
        report = done.stdout.strip().splitlines()
        summary = json.loads(report[-1])
        assert summary["violations"] == 0 and done.returncode == 0, "\n".join(report[:-1]) + done.stderr[-3000:]
        assert "disk_full at step 1.7 under the journal" in done.stdout, report[0]  # the plan this seed draws
        assert summary["kinds"]["disk_full"]["injections"] == 1
        assert work is not None
        (run,) = work.glob("run00-*")
        errs = [p.read_text() for p in sorted(run.glob("trainsup-*.err"))]
        assert len(errs) == 3, errs  # killed; started on the full disk and stopped there; the finishing one
        journal = run / "out-kept" / ".trainsup" / "events.jsonl"
        assert f"cannot write {ROOT.anchor}" in errs[1] and "events.jsonl: No space left on device" in errs[1], errs[1]
        assert "left no end in the journal" in errs[1]
        data = journal.read_bytes()
        assert data.endswith(b"\n")
        events = [json.loads(line) for line in data.split(b"\n")[:-1]]  # every line parses: none cut or glued
        kinds = [e["event"] for e in events]
        starts = [i for i, kind in enumerate(kinds) if kind == "run_start"]
        assert len(starts) == 3 and kinds[-1] == "finished"
        assert "previous_end_unrecorded" in kinds[starts[0]:starts[1]]  # what the killed one left unsaid
        assert "gave_up" in kinds[starts[1]:starts[2]]  # the end of the supervisor on the full disk
        (gave_up,) = [e for e in events if e["event"] == "gave_up"]
        assert gave_up["exit_code"] == 4 and gave_up["reason"].startswith("disk_full")
    finally:
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)
