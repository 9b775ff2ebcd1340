"""GPU telemetry during each point: a DCGM-named ``/metrics`` endpoint (``servefleet up``'s,
or NVIDIA's dcgm-exporter) sampled every ``interval`` s, or — against sim-servers — the
modelled busy fraction from the replicas' own ``/metrics`` (``servefleet:sim_gpu_busy_seconds``).

``--gpu-metrics auto`` (default) tries ``http://<target host>:9400/metrics`` (where ``up`` and
dcgm-exporter serve) once; nothing there is a one-line note, not an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from urllib.parse import urlsplit

import aiohttp

from servefleet.bench.fetch import get_text
from servefleet.telemetry.exporter import DEFAULT_PORT
from servefleet.telemetry.series import SIM_BUSY, GpuSeries, busy_series, parse_gpu_metrics


def auto_url(base_url: str) -> str:
    host = urlsplit(base_url).hostname or "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{DEFAULT_PORT}/metrics"


class GpuSampler:
    """Samples a DCGM-named endpoint between ``start(t0)`` and ``stop()``; ``series`` holds
    the point's samples (times since ``t0``)."""

    def __init__(self, url: str, session: aiohttp.ClientSession, interval: float = 0.5):
        self.url = url
        self.session = session
        self.interval = interval
        self.series: GpuSeries | None = None
        self._task: asyncio.Task | None = None
        self._t0 = 0.0

    async def probe(self) -> str | None:
        """None when the endpoint answers with GPU metrics; else why not (one line)."""
        got = await self._read()
        if isinstance(got, str):
            return got
        return None if got else f"{self.url} has no DCGM_FI_DEV_* GPU metrics"

    async def _read(self) -> dict | str:
        try:
            status, text = await get_text(self.session, self.url, 3.0)
        except aiohttp.ClientConnectorError:
            return f"nothing answers at {self.url}"
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            return f"GET {self.url} failed: {e or type(e).__name__}"
        if status != 200:
            return f"GET {self.url}: HTTP {status}"
        try:
            return parse_gpu_metrics(text)
        except ValueError as e:
            return f"{self.url}: not Prometheus text ({e})"

    def start(self, t0: float) -> None:
        self._t0 = t0
        self.series = GpuSeries(self.url)
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> GpuSeries | None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        return self.series if self.series is not None and self.series.t else None

    async def _run(self) -> None:
        while True:
            t = time.perf_counter() - self._t0
            got = await self._read()
            if isinstance(got, dict) and got and self.series is not None:
                self.series.add(t, got)
            await asyncio.sleep(self.interval)


def modelled_busy(scraper) -> GpuSeries | None:
    """The sim-servers' modelled busy fraction over the point, from the scraper's samples
    (None when the target is not a sim-server)."""
    times, counters = [], []
    key = (SIM_BUSY + "_total", "")
    for t, m in zip(scraper.sample_times, scraper.samples, strict=True):
        parts = getattr(m, "parts", None) or {"": m}
        vals = {u.removesuffix("/metrics"): p[key] for u, p in parts.items() if key in p}
        times.append(t)
        counters.append(vals)
    return busy_series("sim-server /metrics", times, counters)
