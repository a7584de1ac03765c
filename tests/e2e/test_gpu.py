"""The GPU guard inside a real supervised run: the demo trainer runs for real (torch on CPU), the
supervisor runs in this process, and only NVML is the fake table (no GPU here). The table reports
700 MiB for every live process of the trainer's tree (found with psutil, as a driver would list
them), keeps a dead pid listed for a while (drivers free a killed context late), and lists a real
``sleep`` process as another program holding 4 GiB until shortly after the first OOM."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from tests.conftest import ROOT
from tests.e2e.demo_harness import FAST_POLICY, clean_env, demo_argv
from tests.fakenvml import GIB, MIB, FakeNvml, Proc
from trainsup.record.journal import read_events
from trainsup.run.engine import Supervisor
from trainsup.run.policy import parse_policy
from trainsup.run.spec import RunSpec
from trainsup.sensors import gpu

GHOST_S = 3.0  # how long a dead trainer process stays listed with its memory
FOREIGN_AFTER_OOM_S = 6.0


class Box:
    """One fake 24 GiB GPU shared by the trainer's tree and another program."""

    def __init__(self, run_dir: Path, other: subprocess.Popen[bytes]) -> None:
        self.run_dir, self.other = run_dir, other
        self.last_alive: dict[int, float] = {}

    def _oom_at(self) -> float | None:
        path = self.run_dir / "events.jsonl"
        if not path.exists():
            return None
        for line in path.read_text().splitlines():
            event = json.loads(line)
            if event["event"] == "fault" and event["class"] == "cuda_oom":
                return float(event["ts"])
        return None

    def table(self) -> list[dict[str, Any]]:
        now = time.time()
        for child in psutil.Process(os.getpid()).children(recursive=True):
            if child.pid != self.other.pid and child.status() != psutil.STATUS_ZOMBIE:
                self.last_alive[child.pid] = now
        listed = [Proc(pid, 700 * MIB) for pid, seen in self.last_alive.items() if now - seen < GHOST_S]
        oom = self._oom_at()
        if oom is None or now < oom + FOREIGN_AFTER_OOM_S:
            listed.append(Proc(self.other.pid, 4 * GIB))
        used = GIB + sum(p.usedGpuMemory or 0 for p in listed)
        return [{"name": "Fake L4", "uuid": "GPU-fa4e-0001", "used": used, "total": 24 * GIB, "util": 93,
                 "compute": listed}]


def test_an_oom_while_another_program_held_memory_waits_for_it_before_changing_flags(
        assets: dict[str, Path], tmp_path: Path) -> None:
    out, run_dir = tmp_path / "out", tmp_path / "run"
    other = subprocess.Popen(["sleep", "300"])
    try:
        box = Box(run_dir, other)
        policy = parse_policy(FAST_POLICY + "gpu:\n  poll_s: 0.2\n  reclaim_timeout_s: 20\n", "policy.yaml")
        spec = RunSpec(tuple(demo_argv("train_network", assets, out, steps=10)), ROOT, run_dir,
                       clean_env(TRAINSUP_DEMO_SIMULATE="cuda_oom@5", CUDA_VISIBLE_DEVICES="GPU-fa4e"), echo=False)
        code = Supervisor(spec, policy, gpu_probe=lambda: gpu.probe(FakeNvml(box.table))).run()
    finally:
        other.kill()
        other.wait()
    events = read_events(run_dir)
    assert code == 0, events[-3:]
    of = lambda kind: [e for e in events if e["event"] == kind]

    # the OOM's fault carries the attempt's peak, the total and the other program's share
    fault = of("fault")[0]
    assert fault["class"] == "cuda_oom"
    (at_oom,) = fault["gpu"]
    assert at_oom["total_mib"] == 24576 and at_oom["foreign_mib"] == 4096
    assert at_oom["peak_used_mib"] >= 1024 + 4096 + 700
    # ... so the first remedy waits for it and changes no flag
    remedies = of("remedy")
    assert remedies[0]["actions"] == [("wait for other programs to free the GPUs' memory, then restart with "
                                      "the same flags")]
    starts = of("attempt_start")
    assert starts[1]["env"] == {} and "--gradient_checkpointing" not in starts[1]["argv"]
    # the OOM came back without the other program: now the ladder starts, at its first rung
    assert remedies[1]["actions"] == ["set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"]
    # before the second launch: the dead tree's memory came back, the other program was waited for
    reclaim = next(e for e in of("gpu_reclaim") if e["attempt"] == 2)
    assert reclaim["reclaimed"] is True and 0.5 <= reclaim["waited_s"] < 10
    foreign = next(e for e in of("gpu_foreign") if e["attempt"] == 2)
    assert [(p["pid"], p["mib"]) for p in foreign["processes"]] == [(other.pid, 4096)]
    assert foreign["still_there"] == [] and foreign["waited_s"] > 0
    # the first launch only warned (on_foreign: warn)
    first = next(e for e in of("gpu_foreign") if e["attempt"] == 1)
    assert first["waited_s"] == 0 and first["still_there"] is None
    # every attempt's end names its peaks; the trainer's own share is its tree's
    for end in of("attempt_end"):
        (peak,) = end["gpu"]
        assert peak["index"] == 0 and peak["total_mib"] == 24576 and peak["peak_trainer_mib"] >= 700
    status = json.loads((run_dir / "status.json").read_text())
    (device,) = status["gpu"]
    assert device["total_mib"] == 24576 and device["utilization_pct"] == 93 and device["peak_mib"] >= 1724
    assert not [t for t in threading.enumerate() if t.name == "trainsup-gpu"]  # the sampler ended with the run
