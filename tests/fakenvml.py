"""A stand-in for the ``pynvml`` functions the GPU probe calls, over a table of devices.

This machine has no NVIDIA driver, so NVML itself cannot run here; everything above the probe
(the sampler, the guard's waits, the engine) is exercised for real against this table. The table is
a list of dicts, or a function returning one (asked afresh at every call, so a test can let memory
come and go while real processes run). Keys: ``name``, ``used`` (bytes), ``total`` (bytes, default
80 GiB), ``uuid``, ``util``, ``temp``, ``milliwatts``, ``compute`` and ``graphics`` (lists of
``Proc``), and ``memory_error`` / ``process_error`` to make a query fail.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

GIB = 1 << 30
MIB = 1 << 20


class NVMLError(Exception):
    pass


@dataclass
class Proc:
    pid: int
    usedGpuMemory: int | None  # pynvml's spelling, as are the method names below


Table = list[dict[str, Any]]


class FakeNvml:
    def __init__(self, devices: Table | Callable[[], Table], fail_init: bool = False) -> None:
        self.source = devices
        self.fail_init = fail_init
        self.shut = False
        self.queries = 0  # device-count reads: one per probe reading

    def table(self) -> Table:
        return self.source() if callable(self.source) else self.source

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise NVMLError("Driver Not Loaded")

    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return b"550.54.15"

    def nvmlDeviceGetCount(self) -> int:
        self.queries += 1
        self._now = self.table()
        return len(self._now)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> dict[str, Any]:
        return self._now[i]

    def nvmlDeviceGetName(self, h: dict[str, Any]) -> str:
        return str(h["name"])

    def nvmlDeviceGetUUID(self, h: dict[str, Any]) -> str:
        if "uuid" not in h:
            raise NVMLError("Not Supported")
        return str(h["uuid"])

    def nvmlDeviceGetMemoryInfo(self, h: dict[str, Any]) -> SimpleNamespace:
        if h.get("memory_error"):
            raise NVMLError("Not Supported")
        total = h.get("total", 80 * GIB)
        return SimpleNamespace(total=total, used=h["used"], free=total - h["used"])

    def nvmlDeviceGetUtilizationRates(self, h: dict[str, Any]) -> SimpleNamespace:
        if "util" not in h:
            raise NVMLError("Not Supported")
        return SimpleNamespace(gpu=h["util"], memory=0)

    def nvmlDeviceGetTemperature(self, h: dict[str, Any], sensor: int) -> int:
        if "temp" not in h:
            raise NVMLError("Not Supported")
        return int(h["temp"])

    def nvmlDeviceGetPowerUsage(self, h: dict[str, Any]) -> int:
        if "milliwatts" not in h:
            raise NVMLError("Not Supported")
        return int(h["milliwatts"])

    def nvmlDeviceGetComputeRunningProcesses(self, h: dict[str, Any]) -> list[Proc]:
        if h.get("process_error"):
            raise NVMLError("No Permission")
        return list(h.get("compute", []))

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: dict[str, Any]) -> list[Proc]:
        return list(h.get("graphics", []))
