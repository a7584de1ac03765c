"""GpuProbe: the null probe for real (no GPU here), NVML through a small fake of pynvml's functions."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from trainsup.commands.doctor import _gpus
from trainsup.sensors import gpu

GIB = 1 << 30


class NVMLError(Exception):
    pass


@dataclass
class Proc:
    pid: int
    usedGpuMemory: int | None  # pynvml's spelling, as are the method names below


class FakeNvml:
    """The pynvml functions the probe uses, over a table of devices."""

    def __init__(self, devices: list[dict[str, Any]], fail_init: bool = False) -> None:
        self.table = devices
        self.fail_init = fail_init
        self.shut = False

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise NVMLError("Driver Not Loaded")

    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return b"550.54.15"

    def nvmlDeviceGetCount(self) -> int:
        return len(self.table)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> dict[str, Any]:
        return self.table[i]

    def nvmlDeviceGetName(self, h: dict[str, Any]) -> str:
        return str(h["name"])

    def nvmlDeviceGetMemoryInfo(self, h: dict[str, Any]) -> SimpleNamespace:
        if h.get("memory_error"):
            raise NVMLError("Not Supported")
        return SimpleNamespace(total=80 * GIB, used=h["used"], free=80 * GIB - h["used"])

    def nvmlDeviceGetComputeRunningProcesses(self, h: dict[str, Any]) -> list[Proc]:
        if h.get("process_error"):
            raise NVMLError("No Permission")
        return list(h.get("compute", []))

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: dict[str, Any]) -> list[Proc]:
        return list(h.get("graphics", []))


def test_without_a_gpu_the_null_probe_says_why_in_one_line() -> None:
    probe = gpu.probe()  # this machine has no NVIDIA driver: the real null path
    assert not probe.available and probe.devices() == []
    assert "\n" not in probe.reason and probe.reason
    probe.close()
    findings = _gpus(gpu.probe, {})
    assert [(f.severity, f.id) for f in findings] == [("info", "gpu")]
    assert findings[0].message.startswith("GPU memory not checked: ")


def test_a_failing_nvml_init_gives_the_null_probe() -> None:
    probe = gpu.probe(FakeNvml([], fail_init=True))
    assert isinstance(probe, gpu.NullProbe) and "Driver Not Loaded" in probe.reason


def test_nvml_devices_memory_and_processes() -> None:
    fake = FakeNvml([
        {"name": "NVIDIA H100", "used": 12 * GIB, "compute": [Proc(4242, 10 * GIB)], "graphics": [Proc(7, None)]},
        {"name": "NVIDIA H100", "used": 0},
    ])
    probe = gpu.probe(fake)
    assert probe.available and probe.reason == "NVML, driver 550.54.15"
    first, second = probe.devices()
    assert (first.index, first.name, first.total_bytes, first.used_bytes) == (0, "NVIDIA H100", 80 * GIB, 12 * GIB)
    assert first.processes is not None and [(p.pid, p.used_bytes) for p in first.processes] == [
        (7, None), (4242, 10 * GIB)]  # unknown stays unknown, never 0
    assert second.processes == ()
    probe.close()
    assert fake.shut


def test_a_failed_query_is_unknown_not_zero() -> None:
    probe = gpu.probe(FakeNvml([{"name": "A", "used": 1, "memory_error": True, "process_error": True}]))
    (device,) = probe.devices()
    assert (device.total_bytes, device.used_bytes, device.free_bytes, device.processes) == (None, None, None, None)


def test_doctor_warns_of_memory_held_by_other_processes() -> None:
    busy = FakeNvml([{"name": "NVIDIA A100", "used": 30 * GIB, "compute": [Proc(4242, 30 * GIB)]},
                     {"name": "NVIDIA A100", "used": 0}])
    findings = _gpus(lambda: gpu.probe(busy), {})
    assert [(f.severity, f.id) for f in findings] == [("info", "gpu"), ("warning", "gpu_busy"), ("info", "gpu")]
    assert "pid 4242" in findings[1].message and "30.0 GiB" in findings[1].message
    assert "CUDA_VISIBLE_DEVICES" in findings[1].fix
    only_second = _gpus(lambda: gpu.probe(busy), {"CUDA_VISIBLE_DEVICES": "1"})
    assert [f.severity for f in only_second] == ["info"] and only_second[0].message.startswith("GPU 1 ")
    hidden = FakeNvml([{"name": "A", "used": 5 * GIB, "compute": [Proc(1, None)]}])  # containers hide the figure
    assert [f.id for f in _gpus(lambda: gpu.probe(hidden), {})] == ["gpu", "gpu_busy"]


def test_a_device_count_failure_is_reported_not_raised() -> None:
    class Broken(FakeNvml):
        def nvmlDeviceGetCount(self) -> int:
            raise NVMLError("Unknown Error")

    findings = _gpus(lambda: gpu.probe(Broken([])), {})
    assert [(f.severity, f.message) for f in findings] == [("info", "GPU memory unknown: NVML failed (Unknown Error)")]


def test_both_probes_are_gpu_probes() -> None:
    probes: list[gpu.GpuProbe] = [gpu.NullProbe("pynvml missing"), gpu.NvmlProbe(FakeNvml([]))]
    assert [p.available for p in probes] == [False, True]
