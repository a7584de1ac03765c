"""`trainsup demo`, the newcomer's first command, really recovers all four documented faults."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import ROOT, run_trainsup


def test_trainsup_demo_recovers_the_four_documented_faults(tmp_path: Path) -> None:
    r = run_trainsup(["demo", "--keep", str(tmp_path)], cwd=ROOT, timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "4/4 runs recovered" in r.stdout
    classes = []
    for i in range(1, 5):
        events = [json.loads(x) for x in (tmp_path / f"run{i}" / ".trainsup" / "events.jsonl").read_text().splitlines()]
        classes += [e["class"] for e in events if e["event"] == "fault"]
        assert events[-1]["event"] == "finished"
    assert classes == ["meta_tensor", "device_mismatch", "te_cache_none", "fp8_serializer"]
