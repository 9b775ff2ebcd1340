"""Reads a few of each ready replica's own metrics (vLLM names) every ``interval`` seconds:
prefix-cache hits and queries (to compare with the hits the router predicted), queue length,
running requests and KV-cache usage (shown in ``/fleet`` and exported)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from servefleet.gateway.replica import Replica, ReplicaSet

WANTED = {
    "vllm:prefix_cache_hits_total": "prefix_cache_hits",
    "vllm:prefix_cache_queries_total": "prefix_cache_queries",
    "vllm:num_requests_waiting": "num_requests_waiting",
    "vllm:num_requests_running": "num_requests_running",
    "vllm:kv_cache_usage_perc": "kv_cache_usage_perc",
}


def parse_vllm_metrics(text: str) -> dict[str, float]:
    """Sum of the samples of each wanted metric (over its label sets)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        name, _, rest = line.partition("{")
        if not rest:
            name, _, value = line.partition(" ")
        else:
            value = rest.rpartition("} ")[2]
        key = WANTED.get(name)
        if key is None:
            continue
        try:
            out[key] = out.get(key, 0.0) + float(value.split()[0])
        except (ValueError, IndexError):
            continue
    return out


class MetricsScraper:
    def __init__(
        self,
        replicas: ReplicaSet,
        interval: float,
        on_scrape: Callable[[Replica], None] | None = None,
        timeout: float = 2.0,
    ) -> None:
        self.replicas = replicas
        self.interval = interval
        self.timeout = timeout
        self.on_scrape = on_scrape
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="gateway-scraper")

    async def stop(self) -> None:
        t, self._task = self._task, None
        if t is not None:
            t.cancel()
            await asyncio.gather(t, return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            await asyncio.gather(
                *(self.scrape(r) for r in self.replicas.active() if r.health == "healthy"),
                return_exceptions=True,
            )
            await asyncio.sleep(self.interval)

    async def scrape(self, rep: Replica) -> None:
        if rep.closed:
            return
        with contextlib.suppress(TimeoutError, OSError):
            reply = await rep.fetch("GET", "/metrics", timeout=self.timeout, rid="scrape")
            if reply.status != 200:
                return
            rep.scraped = parse_vllm_metrics(reply.body.decode(errors="replace"))
            if self.on_scrape is not None:
                self.on_scrape(rep)
