"""`trainsup run` exits with the code the policy's ``exit_codes:`` names for its own, says so in one
line, and journals its own; ``TRAINSUP_EXIT_CODES=native`` (what `trainsup serve` sets) keeps its own."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.conftest import ROOT, run_trainsup


def test_the_policy_remaps_the_code_trainsup_run_exits_with(tmp_path: Path) -> None:
    pol = tmp_path / "policy.yaml"
    pol.write_text("exit_codes:\n  fault: 75\n")
    run_dir = tmp_path / "run"
    argv = ["run", "--quiet", "--policy", str(pol), "--run-dir", str(run_dir), "--", str(tmp_path / "nope.py")]
    r = run_trainsup(argv, cwd=ROOT)
    assert r.returncode == 75, r.stderr
    assert "no such program" in r.stderr and "trainsup: exit=4 exits 75 (exit_codes.fault)" in r.stderr
    ends = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [e["exit_code"] for e in ends if e["event"] == "gave_up"] == [4]  # the journal keeps its own
    r = run_trainsup(argv, cwd=ROOT, env={**os.environ, "TRAINSUP_EXIT_CODES": "native"})
    assert r.returncode == 4 and "exits 75" not in r.stderr, r.stderr
