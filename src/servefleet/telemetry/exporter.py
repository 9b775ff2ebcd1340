"""The Prometheus endpoint of a fleet's GPUs, in the metric names of NVIDIA's DCGM exporter.

``servefleet up`` (engine vllm) serves it next to the gateway; every scrape reads NVML at that
moment (no background thread). Names, units and labels follow dcgm-exporter, so a bench can
read a real dcgm-exporter with the same code, plus a ``replica`` label (the replicas placed on
that GPU, comma-separated when they share it):

| metric | unit |
|---|---|
| ``DCGM_FI_DEV_GPU_UTIL`` | % of the sample period a kernel ran |
| ``DCGM_FI_DEV_FB_USED`` / ``DCGM_FI_DEV_FB_FREE`` | MiB |
| ``DCGM_FI_DEV_POWER_USAGE`` | W |
| ``DCGM_FI_DEV_SM_CLOCK`` | MHz |
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from servefleet.telemetry.nvml import GpuReading, open_nvml

UTIL, FB_USED, FB_FREE, POWER, SM_CLOCK = (
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_SM_CLOCK",
)
DEFAULT_PORT = 9400
"""dcgm-exporter's port."""
MIB = 1024.0 * 1024.0


def families(readings: Iterable[GpuReading], replicas: Mapping[int, str]) -> list:
    """The metric families of some readings (pure)."""
    labels = ["gpu", "UUID", "modelName", "replica"]
    fams = {
        UTIL: GaugeMetricFamily(UTIL, "GPU utilization (in %).", labels=labels),
        FB_USED: GaugeMetricFamily(FB_USED, "Framebuffer memory used (in MiB).", labels=labels),
        FB_FREE: GaugeMetricFamily(FB_FREE, "Framebuffer memory free (in MiB).", labels=labels),
        POWER: GaugeMetricFamily(POWER, "Power draw (in W).", labels=labels),
        SM_CLOCK: GaugeMetricFamily(SM_CLOCK, "SM clock frequency (in MHz).", labels=labels),
    }
    for r in readings:
        lv = [str(r.index), r.uuid, r.name, replicas.get(r.index, "")]
        free = (
            r.memory_total - r.memory_used
            if r.memory_total is not None and r.memory_used is not None
            else None
        )
        for name, v in (
            (UTIL, r.utilization),
            (FB_USED, None if r.memory_used is None else r.memory_used / MIB),
            (FB_FREE, None if free is None else free / MIB),
            (POWER, r.power),
            (SM_CLOCK, r.sm_clock),
        ):
            if v is not None:
                fams[name].add_metric(lv, v)
    return list(fams.values())


class GpuCollector(Collector):
    """Families of ``read()``'s readings at every scrape (NVML's, or fixed ones in tests)."""

    def __init__(
        self, read: Callable[[], Iterable[GpuReading]], replicas: Mapping[int, str]
    ) -> None:
        self.read, self.replicas = read, dict(replicas)

    def collect(self):
        yield from families(self.read(), self.replicas)


@dataclass(slots=True)
class TelemetryServer:
    url: str
    """The ``/metrics`` URL."""
    server: object
    on_close: Callable[[], None] | None = None

    def close(self) -> None:
        self.server.shutdown()  # type: ignore[attr-defined]
        self.server.server_close()  # type: ignore[attr-defined]
        if self.on_close is not None:
            self.on_close()


def serve_collector(collector: Collector, port: int, host: str = "127.0.0.1") -> TelemetryServer:
    """Serve ``collector`` at ``http://host:port/metrics`` (prometheus_client's threaded HTTP
    server; port 0: any free one). Raises OSError when it cannot listen."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    server, _thread = start_http_server(port, addr=host, registry=reg)
    shown = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
    return TelemetryServer(f"http://{shown}:{server.server_port}/metrics", server)


def serve_gpu_metrics(
    gpus: Mapping[int, str], port: int = DEFAULT_PORT, host: str = "127.0.0.1"
) -> TelemetryServer | str:
    """Serve the GPUs ``gpus`` (index → the replicas on it) at ``http://host:port/metrics``;
    or a one-line reason it cannot (no NVML, port taken)."""
    nvml = open_nvml()
    if isinstance(nvml, str):
        return nvml
    indices = sorted(gpus) or None
    try:
        got = serve_collector(GpuCollector(lambda: nvml.read(indices), gpus), port, host)
    except OSError as e:
        nvml.close()
        return f"GPU telemetry off: cannot listen on {host}:{port} ({e.strerror or e})"
    got.on_close = nvml.close
    return got
