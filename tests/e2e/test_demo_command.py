"""`trainsup demo`, the newcomer's first command: the four documented faults recovered, and a prompt
edit that prompt protection applies at a checkpoint without any crash."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import ROOT, run_trainsup


def test_trainsup_demo_recovers_the_four_documented_faults(tmp_path: Path) -> None:
    r = run_trainsup(["demo", "--keep", str(tmp_path)], cwd=ROOT, timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "5/5 runs finished" in r.stdout
    classes = []
    for i in range(1, 6):
        events = [json.loads(x) for x in (tmp_path / f"run{i}" / ".trainsup" / "events.jsonl").read_text().splitlines()]
        classes += [e["class"] for e in events if e["event"] == "fault"]
        assert events[-1]["event"] == "finished"
    assert classes == ["meta_tensor", "device_mismatch", "te_cache_none", "fp8_serializer"]
    assert "scheduled prompts-protected.txt change: apply at_checkpoint" in r.stdout
