"""Interleaved output of several ranks (issue 34): the first cause is the rank that failed first, not the
others' collective timeouts, lost peers or launcher reports after it; ``trainsup run`` (the live scanner, fed
as the child prints) and ``trainsup diagnose`` (the saved log) name the same fault.

The logs (tests/fixtures/ranks, named ``<class>__<what>.log``) are modelled on multi-rank failures people
report: torchrun's ``[rankN]:`` prefixes, one rank's traceback among the others' bars, NCCL watchdog timeouts
and ``DistBackendError`` tracebacks of the ranks left waiting, gloo's lost peer, torchrun's failure table."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.conftest import diagnose_json
from trainsup.record.journal import read_events
from trainsup.run.engine import Supervisor
from trainsup.run.policy import parse_policy
from trainsup.run.spec import RunSpec

LOGS = sorted((Path(__file__).parents[1] / "fixtures" / "ranks").glob("*.log"))
# A child that prints the log line by line, as the ranks wrote it, then fails as the launcher does.
REPLAY = "import sys, time\nfor line in open(sys.argv[1]):\n    print(line, end='', flush=True)\n" \
         "    time.sleep(0.002)\nsys.exit(1)\n"


@pytest.mark.parametrize("log", LOGS, ids=[p.stem for p in LOGS])
def test_the_first_rank_to_fail_is_the_cause_live_and_in_diagnose(log: Path, tmp_path: Path) -> None:
    expected = log.name.split("__", 1)[0]
    said = diagnose_json(log)
    assert said["fault"] == expected, said
    run_dir = tmp_path / "run"
    spec = RunSpec((sys.executable, "-c", REPLAY, str(log)), tmp_path, run_dir, dict(os.environ), False, None)
    Supervisor(spec, parse_policy("restart:\n  max: 0\n", "policy.yaml")).run()
    faults = [e for e in read_events(run_dir) if e["event"] == "fault"]
    assert [f["class"] for f in faults] == [expected], faults
    assert faults[0]["evidence"].strip() == said["evidence"].strip()
