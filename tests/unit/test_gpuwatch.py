"""The GPU sampler and the guard's relaunch waits, against the fake NVML table (no GPU here) and real
processes (the trainer's tree is found with psutil, so the pids below are live ones)."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakenvml import GIB, MIB, FakeNvml, Proc
from trainsup.faults.remedies import WAIT_FOREIGN
from trainsup.record.journal import Journal, read_events
from trainsup.run.decide import History, Outcome, decide, record
from trainsup.run.events import GpuSampled, new_queue
from trainsup.run.gpuguard import GpuGuard
from trainsup.run.policy import Policy, PolicyError, parse_policy
from trainsup.run.process import Child
from trainsup.sensors import gpu
from trainsup.sensors.gpu import GpuDevice
from trainsup.sensors.gpuwatch import GpuPolicy, GpuSampler, take_sample, tree_pids, visible_devices

TREE = ("import subprocess, sys, time; "
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        "print(c.pid, flush=True); time.sleep(60)")


@pytest.fixture
def trainer() -> Iterator[tuple[subprocess.Popen[str], int]]:
    """A real two-process tree: a 'launcher' and its 'training child' (pid printed)."""
    proc = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    grandchild = int(proc.stdout.readline())
    yield proc, grandchild
    subprocess.run(["pkill", "-P", str(proc.pid)], check=False)
    proc.kill()
    proc.wait()


def _dev(index: int, uuid: str | None) -> GpuDevice:
    return GpuDevice(index, "X", None, None, None, None, uuid)


def test_cuda_visible_devices_by_index_uuid_prefix_and_cut_short_like_cuda() -> None:
    devs = [_dev(0, "GPU-aaaa-1111"), _dev(1, "GPU-bbbb-2222"), _dev(2, "GPU-bbbc-3333")]
    pick = lambda v: [d.index for d in visible_devices(devs, v)]
    assert pick(None) == [0, 1, 2]
    assert pick("2,0") == [2, 0]
    assert pick("GPU-bbbb-2222") == [1] and pick("bbbc") == [2] and pick(" gpu-AAAA ") == [0]
    assert pick("1,7,0") == [1]  # CUDA ignores the list from the first entry naming no device
    assert pick("GPU-bbb") == []  # ambiguous prefix: names no single device
    assert pick("") == [] and pick("-1") == [] and pick("0,0") == [0]


def test_a_sample_splits_memory_into_the_trainers_tree_and_the_others(trainer: Any) -> None:
    proc, grandchild = trainer
    stranger = 1  # init: certainly not in the tree
    tree = tree_pids(proc.pid)
    assert tree == {proc.pid, grandchild}
    probe = gpu.probe(FakeNvml([
        {"name": "A", "used": 9 * GIB, "uuid": "GPU-a", "util": 88,
         "compute": [Proc(proc.pid, 1 * GIB), Proc(grandchild, 6 * GIB), Proc(stranger, 2 * GIB)]},
        {"name": "B", "used": 3 * GIB, "compute": [Proc(grandchild, None)]},  # a container hides the figure
    ]))
    first, second = take_sample(probe.devices(), tree)
    assert (first.used_mib, first.total_mib, first.trainer_mib, first.foreign_mib) == (9216, 81920, 7168, 2048)
    assert [(p.pid, p.mib) for p in first.others or ()] == [(1, 2048)]
    assert first.status()["utilization_pct"] == 88
    assert (second.trainer_mib, second.foreign_mib) == (None, 0)  # unknown stays unknown, never 0


def test_the_sampler_reports_readings_keeps_peaks_and_remembers_the_trees_pids(trainer: Any) -> None:
    proc, grandchild = trainer
    used = iter([2, 6, 4] + [4] * 1000)

    def table() -> list[dict[str, Any]]:
        gib = next(used)
        return [{"name": "A", "used": gib * GIB, "compute": [Proc(grandchild, (gib - 1) * GIB)]}]

    events: queue.Queue[list[Any]] = queue.Queue()
    sampler = GpuSampler(gpu.probe(FakeNvml(table)), lambda d: d, proc.pid, events.put, 0.05)
    sampler.start()
    readings = [events.get(timeout=5) for _ in range(3)]
    sampler.stop()
    assert not sampler.is_alive()
    assert [type(r) for r in readings] == [list] * 3  # a reading: one sample per device
    assert [r[0].used_mib for r in readings] == [2048, 6144, 4096]
    assert sampler.peaks.report() == [{"index": 0, "peak_used_mib": 6144, "peak_trainer_mib": 5120,
                                       "total_mib": 81920}]
    assert sampler.held_by_tree == {grandchild}


class FakeTime:
    """A clock that only the guard's waits move, recording each wait."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []
        self.stop_after: int | None = None

    def clock(self) -> float:
        return self.now

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        self.now += seconds
        return self.stop_after is not None and len(self.waits) >= self.stop_after


def _guard(tmp_path: Path, table: Any, t: FakeTime, said: list[str], **policy: Any) -> tuple[GpuGuard, Journal]:
    journal = Journal(tmp_path)
    guard = GpuGuard(gpu.probe(FakeNvml(table)), None, GpuPolicy(poll_s=2, **policy), journal, said.append,
                     t.clock, t.wait)
    return guard, journal


def _events(tmp_path: Path, name: str) -> list[dict[str, Any]]:
    return [e for e in read_events(tmp_path) if e["event"] == name]


def _run_attempt(guard: GpuGuard, proc: subprocess.Popen[str]) -> None:
    """One attempt's worth of sampling: attach the sampler thread to the tree, take a reading, end."""
    events = new_queue()
    guard.attach(Child(proc, 0.0), events)  # type: ignore[arg-type]
    assert isinstance(events.get(timeout=5), GpuSampled)
    assert guard.attempt_ended() is not None


def test_without_a_driver_the_guard_is_inert_and_says_so_once(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    said: list[str] = []
    guard = GpuGuard(gpu.probe(), None, GpuPolicy(), journal, said.append, time.monotonic, lambda _s: False)
    child = Child(subprocess.Popen(["true"]), 0.0)
    assert guard.attach(child, new_queue()) is child and guard.sampler is None  # no thread
    child.popen.wait()
    assert guard.attempt_ended() is None and guard.before_launch(2) is False
    assert json.loads((tmp_path / "status.json").read_text())["gpu"] is None
    infos = _events(tmp_path, "info")
    assert len(infos) == 1 and infos[0]["message"].startswith("GPU monitoring off: ")
    assert len(said) == 1


def test_a_relaunch_waits_until_the_dead_trees_memory_is_back(tmp_path: Path, trainer: Any) -> None:
    proc, grandchild = trainer
    t, said = FakeTime(), []
    state = {"held": True, "reads_after": 0}

    def table() -> list[dict[str, Any]]:
        if not state["held"]:
            state["reads_after"] += 1
        ghost = state["held"] or state["reads_after"] < 3  # listed after its death, as drivers do
        late = state["reads_after"] < 5  # memory back two readings later still
        return [{"name": "A", "used": (20 * GIB if ghost or late else GIB + 300 * MIB),
                 "compute": [Proc(grandchild, 19 * GIB)] if ghost else []}]

    state["held"] = False
    state["reads_after"] = 10  # the baseline: before the first launch nothing of the run is there
    guard, _ = _guard(tmp_path, table, t, said)
    state["held"], state["reads_after"] = True, 0
    _run_attempt(guard, proc)
    state["held"] = False
    assert guard.before_launch(2) is False
    (reclaim,) = _events(tmp_path, "gpu_reclaim")
    assert reclaim["reclaimed"] is True and reclaim["waited_s"] == 8.0  # four polls of 2 s
    assert t.waits == [2, 2, 2, 2]


def test_a_relaunch_waits_at_most_the_timeout_then_launches_with_a_warning(tmp_path: Path, trainer: Any) -> None:
    proc, _grandchild = trainer
    t, said = FakeTime(), []
    used = {"gib": 1}
    guard, _ = _guard(tmp_path, lambda: [{"name": "A", "used": used["gib"] * GIB, "compute": []}], t, said,
                      reclaim_timeout_s=7)
    used["gib"] = 12  # memory no process owns any more (a leaked context) stays held
    _run_attempt(guard, proc)
    assert guard.before_launch(2) is False
    (reclaim,) = _events(tmp_path, "gpu_reclaim")
    assert (reclaim["reclaimed"], reclaim["waited_s"]) == (False, 7.0)
    assert reclaim["still_held"] == ["GPU 0: 11264 MiB above its 1024 MiB before the first launch"]
    assert t.waits == [2, 2, 2, 1]
    assert any(s.startswith("warning: GPU memory of the last attempt not reclaimed after 7 s") for s in said)


def test_memory_another_program_took_meanwhile_does_not_hold_up_the_relaunch(tmp_path: Path, trainer: Any) -> None:
    proc, _ = trainer
    t, said = FakeTime(), []
    others: list[Proc] = []
    guard, _ = _guard(tmp_path, lambda: [{"name": "A", "used": GIB + sum(p.usedGpuMemory or 0 for p in others),
                                          "compute": list(others)}], t, said)
    others.append(Proc(1, 10 * GIB))  # a ComfyUI started while the trainer ran
    _run_attempt(guard, proc)
    assert guard.before_launch(2) is False
    assert _events(tmp_path, "gpu_reclaim")[0]["waited_s"] == 0
    (foreign,) = _events(tmp_path, "gpu_foreign")
    assert foreign["processes"] == [{"gpu": 0, "pid": 1, "name": foreign["processes"][0]["name"], "mib": 10240}]
    assert (foreign["waited_s"], foreign["still_there"]) == (0, None)
    assert t.waits == []  # on_foreign: warn reports and goes on
    assert any("pid 1 " in s and "10240 MiB on GPU 0" in s for s in said)


def test_on_foreign_wait_waits_for_the_other_program_up_to_the_timeout(tmp_path: Path) -> None:
    t, said = FakeTime(), []
    big = [Proc(1, 3 * GIB), Proc(2, 512 * MIB)]  # the small one is under foreign_warn_mib: not reported
    leaves_at = {"t": 6.0}

    def table() -> list[dict[str, Any]]:
        if t.now >= leaves_at["t"] and big[0].pid == 1:
            del big[0]
        return [{"name": "A", "used": 4 * GIB, "compute": list(big)}]

    guard, _ = _guard(tmp_path, table, t, said, on_foreign="wait")
    assert guard.before_launch(1) is False
    assert t.waits == [2, 2, 2]
    (foreign,) = _events(tmp_path, "gpu_foreign")
    assert [(p["pid"], p["mib"]) for p in foreign["processes"]] == [(1, 3072)]
    assert foreign["waited_s"] == 6.0 and foreign["still_there"] == []
    assert said[-1] == "the other programs freed the GPUs after 6.0 s"
    big.insert(0, Proc(1, 3 * GIB))
    leaves_at["t"] = 1e9
    t.stop_after = 5
    assert guard.before_launch(1) is True  # a stop request ends the wait at once


def test_an_oom_carries_peak_total_and_foreign_share(tmp_path: Path, trainer: Any) -> None:
    proc, grandchild = trainer
    t, said = FakeTime(), []
    guard, _ = _guard(tmp_path, lambda: [{"name": "A", "used": 23 * GIB, "total": 24 * GIB,
                                          "compute": [Proc(grandchild, 17 * GIB), Proc(1, 6 * GIB)]}], t, said)
    _run_attempt(guard, proc)
    details, foreign = guard.oom_details()
    assert details == [{"index": 0, "peak_used_mib": 23552, "total_mib": 24576, "foreign_mib": 6144}]
    assert foreign == 6144


def _oom(attempt: int, foreign_mib: int) -> Outcome:
    return Outcome(attempt=attempt, exit_code=1, signal=None, child_status=None, child_signal=None, uptime_s=30.0,
                   fault="cuda_oom", evidence="CUDA out of memory", evidence_line=10, steps_trained=3,
                   saved_new_state=False, ended_at=float(attempt), stop_signal=None, foreign_mib=foreign_mib)


def test_an_oom_while_others_held_memory_waits_for_them_once_before_changing_flags() -> None:
    history, policy = History(), Policy()
    first = decide(history, _oom(1, 6144), policy, 1.0, lambda _r: True)
    assert first.kind == "restart" and first.rung is WAIT_FOREIGN
    record(history, _oom(1, 6144), first, 1.0)
    second = decide(history, _oom(2, 6144), policy, 2.0, lambda _r: True)
    assert second.rung is not None and second.rung.actions[0].kind == "set_env"  # the ladder's first rung
    record(history, _oom(2, 6144), second, 2.0)
    small = decide(History(), _oom(1, 100), policy, 1.0, lambda _r: True)  # under foreign_warn_mib
    assert small.rung is not None and small.rung.actions[0].kind == "set_env"


def test_the_gpu_section_of_the_policy() -> None:
    p = parse_policy("gpu:\n  poll_s: 0.5\n  on_foreign: wait\n  reclaim_timeout_s: 30\n", "p.yaml")
    assert p.gpu == GpuPolicy(poll_s=0.5, on_foreign="wait", reclaim_timeout_s=30)
    assert p.hang == Policy().hang
    with pytest.raises(PolicyError, match=r"^p\.yaml:3: gpu\.on_foreign: expected warn \| wait, got 'kill'$"):
        parse_policy("gpu:\n  poll_s: 1\n  on_foreign: kill\n", "p.yaml")


def test_a_hangs_evidence_names_the_gpus_utilisation_while_the_attempt_runs(tmp_path: Path, trainer: Any) -> None:
    from trainsup.sensors.hang import HangClock, HangPolicy, hang_evidence, hang_spot

    proc, _ = trainer
    t, said = FakeTime(), []
    guard, _ = _guard(tmp_path, lambda: [{"name": "A", "used": GIB, "util": 0, "compute": []},
                                         {"name": "B", "used": GIB, "compute": []}], t, said)
    events = new_queue()
    guard.attach(Child(proc, 0.0), events)  # type: ignore[arg-type]
    assert isinstance(events.get(timeout=5), GpuSampled)
    assert guard.utilization() == "GPU 0 at 0%"  # GPU 1 does not say: left out, not 0
    text = hang_evidence(400, HangClock(HangPolicy(), 0.0), 12, ["pid 7 wait (threading.py:320)"], False,
                         guard.utilization())
    assert text.endswith("; GPU 0 at 0%")
    assert hang_spot(text) == "at step 12, pid 7 wait (threading.py:320)"  # the spot ignores the utilisation
    guard.attempt_ended()
    assert guard.utilization() is None
