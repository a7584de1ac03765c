"""GpuProbe: the null probe for real (no GPU here), NVML through a small fake of pynvml's functions."""

from __future__ import annotations

from tests.fakenvml import GIB, FakeNvml, NVMLError, Proc
from trainsup.commands.doctor import _gpus
from trainsup.sensors import gpu


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


def test_nvml_utilisation_temperature_power_and_uuid() -> None:
    probe = gpu.probe(FakeNvml([{"name": "A", "used": 0, "uuid": "GPU-5f2c", "util": 97, "temp": 71,
                                 "milliwatts": 312_500}, {"name": "B", "used": 0}]))
    busy, bare = probe.devices()
    assert (busy.uuid, busy.utilization_pct, busy.temperature_c, busy.power_w) == ("GPU-5f2c", 97, 71, 312.5)
    assert (bare.uuid, bare.utilization_pct, bare.temperature_c, bare.power_w) == (None, None, None, None)


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
