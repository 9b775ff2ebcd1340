"""NVML readings of a host's GPUs (nvidia-ml-py). ``open_nvml()`` returns an ``Nvml`` or the
reason there is none (no package, no driver), never raises."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MISSING_PACKAGE = (
    "GPU telemetry off: nvidia-ml-py is not installed (pip install 'servefleet[telemetry]')"
)


@dataclass(frozen=True, slots=True)
class GpuReading:
    index: int
    uuid: str
    name: str
    utilization: float | None
    """Percent of the last sample period a kernel was running (NVML's ``gpu`` utilization)."""
    memory_used: float | None
    """Bytes."""
    memory_total: float | None
    power: float | None
    """Watts."""
    sm_clock: float | None
    """MHz."""


class Nvml:
    """An initialised NVML; ``read()`` samples every GPU (or ``indices``)."""

    def __init__(self, pynvml) -> None:
        self.nv = pynvml
        self.count = pynvml.nvmlDeviceGetCount()
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(self.count)]

    def read(self, indices: Sequence[int] | None = None) -> list[GpuReading]:
        nv = self.nv
        out = []
        for i in indices if indices is not None else range(self.count):
            if not 0 <= i < self.count:
                continue
            h = self.handles[i]
            util = _try(lambda h=h: float(nv.nvmlDeviceGetUtilizationRates(h).gpu))
            mem = _try(lambda h=h: nv.nvmlDeviceGetMemoryInfo(h))
            out.append(
                GpuReading(
                    i,
                    _text(_try(lambda h=h: nv.nvmlDeviceGetUUID(h))),
                    _text(_try(lambda h=h: nv.nvmlDeviceGetName(h))),
                    util,
                    float(mem.used) if mem is not None else None,
                    float(mem.total) if mem is not None else None,
                    _try(lambda h=h: nv.nvmlDeviceGetPowerUsage(h) / 1000.0),
                    _try(lambda h=h: float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))),
                )
            )
        return out

    def close(self) -> None:
        _try(self.nv.nvmlShutdown)


def open_nvml() -> Nvml | str:
    """NVML ready to read, or a one-line reason why not."""
    try:
        import pynvml
    except ImportError:
        return MISSING_PACKAGE
    try:
        pynvml.nvmlInit()
        return Nvml(pynvml)
    except pynvml.NVMLError as e:
        return f"GPU telemetry off: NVML is not available here ({e})"


def _try(fn):
    """A reading NVML cannot give on this GPU (``NotSupported``...) is None, not an error."""
    try:
        return fn()
    except Exception:
        return None


def _text(v) -> str:
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return "" if v is None else str(v)
