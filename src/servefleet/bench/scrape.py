"""The server's own view: vLLM's Prometheus ``/metrics`` before and after each point.

``parse_metrics`` (pure) reads the text format into sums over label sets (a fleet behind a
gateway, or several engines, adds up); ``server_delta`` (pure) turns two scrapes and the gauges
sampled in between into what the report shows next to the client's figures: preemptions,
prefix-cache hit rate, peak KV usage, re-prefill estimate, and server-side TTFT / queue /
prefill / decode / E2E / ITL (mean and percentiles estimated from histogram buckets).
``Scraper`` does the HTTP and the sampling (``start()``/``stop()``).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
from dataclasses import dataclass, field

import aiohttp

HISTOGRAMS = {
    "ttft": "vllm:time_to_first_token_seconds",
    "queue": "vllm:request_queue_time_seconds",
    "prefill": "vllm:request_prefill_time_seconds",
    "decode": "vllm:request_decode_time_seconds",
    "e2e": "vllm:e2e_request_latency_seconds",
    "itl": "vllm:inter_token_latency_seconds",
    "tpot": "vllm:request_time_per_output_token_seconds",
}
COUNTERS = {
    "preemptions": "vllm:num_preemptions_total",
    "prefix_queries": "vllm:prefix_cache_queries_total",
    "prefix_hits": "vllm:prefix_cache_hits_total",
    "prompt_tokens": "vllm:prompt_tokens_total",
    "generation_tokens": "vllm:generation_tokens_total",
}
GAUGES = {
    "kv_usage": "vllm:kv_cache_usage_perc",
    "running": "vllm:num_requests_running",
    "waiting": "vllm:num_requests_waiting",
}
_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LE = re.compile(r'le="([^"]+)"')

Metrics = dict[tuple[str, str], float]
"""(sample name, ``le`` label or "") → value summed over every other label."""


def parse_metrics(text: str) -> Metrics:
    out: Metrics = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = _LINE.match(line)
        if not m:
            continue
        name, labels, value = m.groups()
        try:
            v = float(value)
        except ValueError:
            continue
        le = ""
        if labels and name.endswith("_bucket"):
            lm = _LE.search(labels)
            le = lm.group(1) if lm else ""
        key = (name, le)
        out[key] = out.get(key, 0.0) + v
    return out


def _get(m: Metrics, name: str) -> float | None:
    return m.get((name, ""))


@dataclass(slots=True)
class HistDelta:
    count: float
    mean: float | None
    p50: float | None
    p95: float | None
    p99: float | None

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}


def histogram_delta(before: Metrics, after: Metrics, name: str) -> HistDelta | None:
    """What a histogram observed between two scrapes; percentiles interpolated in buckets."""
    c1, c0 = _get(after, name + "_count"), _get(before, name + "_count") or 0.0
    if c1 is None:
        return None
    count = c1 - c0
    s = (_get(after, name + "_sum") or 0.0) - (_get(before, name + "_sum") or 0.0)
    buckets = sorted(
        (float(le), v - before.get((n, le), 0.0))
        for (n, le), v in after.items()
        if n == name + "_bucket" and le
    )
    return HistDelta(
        count,
        s / count if count > 0 else None,
        *(_quantile(buckets, q, count) for q in (0.5, 0.95, 0.99)),
    )


def _quantile(buckets: list[tuple[float, float]], q: float, count: float) -> float | None:
    """Prometheus' histogram_quantile: linear inside the bucket (cumulative counts)."""
    if count <= 0 or not buckets:
        return None
    rank = q * count
    prev_le, prev_c = 0.0, 0.0
    for le, c in buckets:
        if c >= rank:
            if math.isinf(le):
                return prev_le
            if c == prev_c:
                return le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return prev_le


@dataclass(slots=True)
class ServerView:
    """What the server said about one point."""

    preemptions: float | None = None
    prefix_hit_rate: float | None = None
    peak_kv_usage: float | None = None
    peak_running: float | None = None
    peak_waiting: float | None = None
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    reprefill_estimate: float | None = None
    """(server prompt tokens − prompt tokens the client's requests had) ÷ server prompt tokens:
    prompt tokens processed more than once (recomputed after preemption), an estimate."""
    histograms: dict[str, HistDelta] = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__slots__ if k != "histograms"}
        d["histograms"] = {k: v.to_dict() for k, v in self.histograms.items()}
        return d


def server_delta(
    before: Metrics, after: Metrics, samples: list[Metrics], client_prompt_tokens: int | None
) -> ServerView:
    def delta(key: str) -> float | None:
        a = _get(after, COUNTERS[key])
        return None if a is None else a - (_get(before, COUNTERS[key]) or 0.0)

    def peak(key: str) -> float | None:
        vals = [v for m in (*samples, after) if (v := _get(m, GAUGES[key])) is not None]
        return max(vals) if vals else None

    q, h = delta("prefix_queries"), delta("prefix_hits")
    pt = delta("prompt_tokens")
    re_est = None
    if pt and client_prompt_tokens is not None:
        re_est = max(0.0, pt - client_prompt_tokens) / pt
    return ServerView(
        preemptions=delta("preemptions"),
        prefix_hit_rate=(h / q) if q and h is not None else None,
        peak_kv_usage=peak("kv_usage"),
        peak_running=peak("running"),
        peak_waiting=peak("waiting"),
        prompt_tokens=pt,
        generation_tokens=delta("generation_tokens"),
        reprefill_estimate=re_est,
        histograms={
            k: d for k, name in HISTOGRAMS.items() if (d := histogram_delta(before, after, name))
        },
    )


class Scraper:
    """Scrapes ``/metrics`` once now (``scrape``), and every ``interval`` s in the background
    between ``start()`` and ``stop()`` (for peaks of the gauges)."""

    def __init__(self, base_url: str, session: aiohttp.ClientSession, interval: float = 0.5):
        self.url = base_url.rstrip("/") + "/metrics"
        self.session = session
        self.interval = interval
        self.samples: list[Metrics] = []
        self.available = True
        self.note: str | None = None
        self._task: asyncio.Task | None = None

    async def scrape(self) -> Metrics | None:
        if not self.available:
            return None
        try:
            async with self.session.get(self.url, timeout=aiohttp.ClientTimeout(total=5)) as r:
                if r.status != 200:
                    self.available, self.note = False, f"GET /metrics: HTTP {r.status}"
                    return None
                return parse_metrics(await r.text())
        except (aiohttp.ClientError, TimeoutError) as e:
            self.available, self.note = False, f"GET /metrics failed: {e}"
            return None

    def start(self) -> None:
        self.samples = []
        if self.available:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            m = await self.scrape()
            if m is None:
                return
            self.samples.append(m)
