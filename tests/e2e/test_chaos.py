"""A short seeded chaos soak: `benchmarks/chaos.py` over five runs, one for each fault kind first
(trainer SIGKILL, supervisor SIGKILL, SIGSTOP past the hang timeout, a full disk, a mid-run edit),
plus what each run's seed adds. Every invariant the benchmark checks must hold: final weights equal
to an uninterrupted run's, no earlier file changed, resumes only from complete states, no orphan or
second trainer, a journal that ends `finished`, no traceback of trainsup's own. A failure prints the
run's seed; `python benchmarks/chaos.py --replay SEED` replays that run alone."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT

RUNS, SEED = 5, 3
KINDS = ("kill_trainer", "kill_supervisor", "freeze", "disk_full", "edit")


def test_a_seeded_chaos_soak_keeps_every_invariant() -> None:
    done = subprocess.run([sys.executable, "benchmarks/chaos.py", "--runs", str(RUNS), "--seed", str(SEED), "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    report = done.stdout.strip().splitlines()
    summary = json.loads(report[-1])  # the last line is the one JSON object
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
