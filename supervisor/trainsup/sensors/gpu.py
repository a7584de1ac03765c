"""Owns asking the GPUs how much memory they have and who holds it: the ``GpuProbe`` protocol.

``NvmlProbe`` reads NVIDIA's management library through ``pynvml`` (the ``nvidia-ml-py``
package): per device its UUID, the total, used and free memory, utilisation, temperature, power
draw and the processes holding memory.
``NullProbe`` stands in where there is no GPU, driver or library, with a one-line reason.
``probe()`` picks NVML when it initialises, else the null probe; it never raises.

A value NVML cannot give is ``None``, "unknown", never 0: a busy GPU must not look empty because
a query failed (``usedGpuMemory`` is unavailable inside many containers, for example).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["GpuDevice", "GpuProbe", "GpuProcess", "NullProbe", "NvmlProbe", "probe"]


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_bytes: int | None  # None: NVML does not say
    name: str | None  # None: not visible from here (another container, or gone)


@dataclass(frozen=True)
class GpuDevice:
    index: int
    name: str
    total_bytes: int | None
    used_bytes: int | None
    free_bytes: int | None
    processes: tuple[GpuProcess, ...] | None  # None: the process list could not be read
    uuid: str | None = None  # "GPU-8c1e...": what CUDA_VISIBLE_DEVICES may name instead of the index
    utilization_pct: int | None = None  # busy share of the last sample period
    temperature_c: int | None = None
    power_w: float | None = None


class GpuProbe(Protocol):
    @property
    def available(self) -> bool:
        """Whether GPUs could be asked at all."""
        ...

    @property
    def reason(self) -> str:
        """Why not, when not available; else what answers (``NVML, driver 550.54``)."""
        ...

    def devices(self) -> list[GpuDevice]:
        """Every device; raises when not even the device count can be read."""
        ...

    def close(self) -> None: ...


class NullProbe:
    """No GPUs to ask."""

    def __init__(self, reason: str) -> None:
        self._reason = reason

    @property
    def available(self) -> bool:
        return False

    @property
    def reason(self) -> str:
        return self._reason

    def devices(self) -> list[GpuDevice]:
        return []

    def close(self) -> None:
        pass


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _process_name(pid: int) -> str | None:
    try:
        import psutil

        return str(psutil.Process(pid).name())
    except Exception:  # noqa: BLE001 - gone, another PID namespace, or no permission: unknown
        return None


class NvmlProbe:
    """GPUs through NVML.  ``nvml`` is the ``pynvml`` module or anything with its functions
    (tests pass a fake); the constructor initialises it and raises when that fails."""

    def __init__(self, nvml: Any = None) -> None:
        if nvml is None:
            import pynvml

            nvml = pynvml
        self._nvml = nvml
        nvml.nvmlInit()
        self._open = True
        try:
            self._driver = _text(nvml.nvmlSystemGetDriverVersion())
        except Exception:  # noqa: BLE001 - a missing detail, not a failure
            self._driver = "unknown"

    @property
    def available(self) -> bool:
        return True

    @property
    def reason(self) -> str:
        return f"NVML, driver {self._driver}"

    def devices(self) -> list[GpuDevice]:
        nvml = self._nvml
        out = []
        for index in range(int(nvml.nvmlDeviceGetCount())):  # raises: nothing is known then
            handle = self._ask(lambda i=index: nvml.nvmlDeviceGetHandleByIndex(i))
            if handle is None:
                out.append(GpuDevice(index, f"GPU {index}", None, None, None, None))
                continue
            name = self._ask(lambda h=handle: _text(nvml.nvmlDeviceGetName(h))) or f"GPU {index}"
            memory = self._ask(lambda h=handle: nvml.nvmlDeviceGetMemoryInfo(h))
            total = _bytes(getattr(memory, "total", None))
            used = _bytes(getattr(memory, "used", None))
            free = _bytes(getattr(memory, "free", None))
            uuid = self._ask(lambda h=handle: _text(nvml.nvmlDeviceGetUUID(h)))
            rates = self._ask(lambda h=handle: nvml.nvmlDeviceGetUtilizationRates(h))
            temperature = self._ask(lambda h=handle: nvml.nvmlDeviceGetTemperature(h, 0))  # 0: the GPU die
            milliwatts = _count(self._ask(lambda h=handle: nvml.nvmlDeviceGetPowerUsage(h)))
            out.append(GpuDevice(index, name, total, used, free, self._processes(handle), uuid,
                                 _count(getattr(rates, "gpu", None)), _count(temperature),
                                 None if milliwatts is None else milliwatts / 1000))
        return out

    def _processes(self, handle: object) -> tuple[GpuProcess, ...] | None:
        nvml = self._nvml
        found: dict[int, GpuProcess] = {}
        for query in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            listed = self._ask(lambda q=query: getattr(nvml, q)(handle))
            if listed is None:
                return None  # a partial list would understate who holds the memory
            for p in listed:
                pid = int(p.pid)
                used = _bytes(getattr(p, "usedGpuMemory", None))
                known = found.get(pid)
                if known is None or (used or 0) > (known.used_bytes or 0):
                    found[pid] = GpuProcess(pid, used, _process_name(pid))
        return tuple(sorted(found.values(), key=lambda p: p.pid))

    @staticmethod
    def _ask(query: Any) -> Any:
        try:
            return query()
        except Exception:  # noqa: BLE001 - NVMLError and friends: this value is unknown
            return None

    def close(self) -> None:
        if self._open:
            self._open = False
            self._ask(self._nvml.nvmlShutdown)


def _bytes(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None  # pynvml gives None (or a huge sentinel) when a value is not available
    return value if value < 1 << 62 else None


def _count(value: object) -> int | None:
    """A small reading (percent, degrees, milliwatts); NVML's "not available" sentinels are None."""
    got = _bytes(value)
    return got if got is not None and got < 1 << 31 else None


def probe(nvml: Any = None) -> GpuProbe:
    """NVML when it initialises, else a null probe saying why in one line."""
    try:
        return NvmlProbe(nvml)
    except ImportError:
        return NullProbe("nvidia-ml-py (pynvml) is not installed")
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        detail = str(exc).strip() or type(exc).__name__
        return NullProbe(f"no NVIDIA GPU or driver visible (NVML: {detail})")
