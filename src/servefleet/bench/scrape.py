"""The server's own view: vLLM's Prometheus ``/metrics`` before and after each point.

``parse_metrics`` (pure) reads the text format into sums over label sets (several engines add
up; KV usage, a fraction per engine, takes the fullest); ``combine`` (pure) merges the scrapes
of several replicas the same way; ``server_delta`` (pure) turns two scrapes and the gauges
sampled in between into what the report shows next to the client's figures: preemptions,
prefix-cache hit rate, peak KV usage, re-prefill (derived, or bounded: ``reprefill_bounds``), and server-side TTFT / queue /
prefill / decode / E2E / ITL (mean and percentiles estimated from histogram buckets).
``Scraper`` does the HTTP and the sampling (``start()``/``stop()``). When the target is a
servefleet gateway (it answers ``GET /fleet`` with its replicas), the gateway's own ``/metrics``
has no vLLM figures, so the scraper reads every replica's ``/metrics`` directly and combines
them.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import time
from dataclasses import dataclass, field

import aiohttp

from servefleet.bench.fetch import get_json, get_text, refusal

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
    "prompt_cached": "vllm:prompt_tokens_cached_total",
    "generation_tokens": "vllm:generation_tokens_total",
}
GAUGES = {
    "kv_usage": "vllm:kv_cache_usage_perc",
    "running": "vllm:num_requests_running",
    "waiting": "vllm:num_requests_waiting",
}
MAX_GAUGES = frozenset({GAUGES["kv_usage"]})
"""Gauges that are a fraction per engine: engines and replicas combine by their maximum (the
fullest KV cache), never by a sum. Every other sample (counters, histogram buckets, sums and
counts, running/waiting) is summed."""
_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LE = re.compile(r'le="([^"]+)"')

Metrics = dict[tuple[str, str], float]
"""(sample name, ``le`` label or "") → value summed over every other label (the maximum for
``MAX_GAUGES``). ``le`` is normalised (``str(float(le))``: "0.1", "1.0", "inf") so that
replicas formatting a bound differently still share its bucket."""


class Scrape(dict):
    """``Metrics`` of one scrape (the combination of ``parts``), and where they came from.

    ``parts``: ``/metrics`` URL → that URL's metrics (one entry when the target was scraped
    itself); ``replicas``: whether the parts are the replicas behind a gateway; ``notes``: what
    went wrong on the way (a replica that did not answer...)."""

    __slots__ = ("notes", "parts", "replicas")

    def __init__(
        self, parts: dict[str, Metrics], replicas: bool = False, notes: list[str] | None = None
    ) -> None:
        super().__init__(combine(parts.values()))
        self.parts = parts
        self.replicas = replicas
        self.notes = list(notes or [])


def _add(out: Metrics, key: tuple[str, str], v: float) -> None:
    if key[0] in MAX_GAUGES:
        out[key] = max(out[key], v) if key in out else v
    else:
        out[key] = out.get(key, 0.0) + v


def combine(scrapes) -> Metrics:
    """Several replicas' metrics as one server's: counters and histograms summed, running and
    waiting summed, KV usage the maximum."""
    out: Metrics = {}
    for m in scrapes:
        for key, v in m.items():
            _add(out, key, v)
    return out


def _norm_le(le: str) -> str:
    try:
        return str(float(le))
    except ValueError:
        return le


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
            le = _norm_le(lm.group(1)) if lm else ""
        _add(out, (name, le), v)
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
    prefix_queries: float | None = None
    prefix_hits: float | None = None
    peak_kv_usage: float | None = None
    peak_running: float | None = None
    peak_waiting: float | None = None
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    prompt_cached: float | None = None
    reprefill: float | None = None
    """Re-prefill ratio when /metrics determine it: 0 when nothing was preempted (nothing can
    have been recomputed); None otherwise (vLLM counts no recomputed token: see
    ``reprefill_bounds``)."""
    reprefill_max: float | None = None
    """With preemptions: the largest re-prefill ratio they allow (each preemption recomputes
    at most the longest context a request of the point had: prompt + output)."""
    client_prompt_tokens: float | None = None
    """The prompt tokens of the client's requests (vLLM's ``prompt_tokens`` equals them: it
    counts each request's prompt once, never a recomputation)."""
    histograms: dict[str, HistDelta] = field(default_factory=dict)
    scraped: list[str] = field(default_factory=list)
    """The ``/metrics`` URLs these figures combine (the target's own, or a gateway's replicas)."""
    replicas: dict[str, dict] | None = None
    """Behind a gateway: each replica's own figures (by its ``/metrics`` URL)."""
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__slots__ if k != "histograms"}
        d["histograms"] = {k: v.to_dict() for k, v in self.histograms.items()}
        return d


@dataclass(frozen=True, slots=True)
class ClientTokens:
    """What the client knows of its requests of a point, for the re-prefill derivation."""

    prompt_tokens: int | None
    """Prompt tokens of the requests that succeeded (None: unknown for these replicas)."""
    max_context: int
    """The longest prompt + output of any request of the point (an upper bound of what one
    preemption can make a replica recompute)."""


def reprefill_bounds(
    preemptions: float | None,
    prompt_tokens: float | None,
    prompt_cached: float | None,
    max_context: int,
) -> tuple[float | None, float | None]:
    """(re-prefill ratio, or None; its upper bound) from vLLM 0.26's counters (pure).

    vLLM 0.26 exposes no count of recomputed tokens: ``prompt_tokens`` counts each request's
    prompt once, at its first prefill, and ``prefix_cache_queries/hits`` leave preempted
    requests' re-admissions out (PrefixCacheStats.preempted_* are not exported). What it does
    expose bounds the ratio: no preemption → nothing recomputed (exactly 0); else each of the
    ``preemptions`` recomputed at most ``max_context`` tokens (fewer when the prefix cache still
    held its blocks), so the ratio recomputed ÷ (prompt tokens computed + recomputed) lies in
    [0, U ÷ (computed + U)] with U = preemptions × max_context."""
    if preemptions is None:
        return None, None
    if preemptions <= 0:
        return 0.0, 0.0
    if prompt_tokens is None or max_context <= 0:
        return None, None
    computed = max(0.0, prompt_tokens - (prompt_cached or 0.0))
    u = preemptions * max_context
    return None, u / (computed + u)


def server_delta(
    before: Metrics, after: Metrics, samples: list[Metrics], client: ClientTokens | None
) -> ServerView:
    """The view of one point. With ``Scrape``s, only the URLs scraped both before and after
    count (and none whose counters went backwards: restarted during the point)."""
    b_parts, a_parts = getattr(before, "parts", None), getattr(after, "parts", None)
    if b_parts is None or a_parts is None:
        return _view(before, after, samples, client)
    notes = [*before.notes, *after.notes, *(n for m in samples for n in getattr(m, "notes", ()))]
    keep = []
    for u in dict.fromkeys([*b_parts, *a_parts]):
        if u not in a_parts or u not in b_parts:
            when = "before" if u in b_parts else "after"
            notes.append(f"{u}: scraped only {when} the point, left out")
        elif _went_back(b_parts[u], a_parts[u]):
            notes.append(f"{u}: counters went backwards (restarted?), left out")
        else:
            keep.append(u)
    if len(keep) == len(a_parts) == len(b_parts):
        b, a = before, after
    else:
        b, a = combine(b_parts[u] for u in keep), combine(a_parts[u] for u in keep)
        if client is not None:  # the requests of the replicas left out are unknown
            client = ClientTokens(None, client.max_context)
    view = _view(b, a, samples, client)
    view.scraped = keep
    view.notes = list(dict.fromkeys(notes))[:20]
    if after.replicas:
        view.replicas = {
            u: _replica_figures(
                b_parts[u],
                a_parts[u],
                [m.parts[u] for m in samples if u in getattr(m, "parts", {})],
                ClientTokens(None, client.max_context) if client is not None else None,
            )
            for u in keep
        }
    return view


def _went_back(before: Metrics, after: Metrics) -> bool:
    return any(
        (v1 := after.get(k)) is not None and v1 < v0
        for k, v0 in before.items()
        if k[0].endswith(("_total", "_count", "_sum", "_bucket"))
    )


def _replica_figures(
    before: Metrics, after: Metrics, samples: list[Metrics], client: ClientTokens | None
) -> dict:
    v = _view(before, after, samples, client)
    e2e, ttft = v.histograms.get("e2e"), v.histograms.get("ttft")
    return {
        "requests": e2e.count if e2e else None,
        "preemptions": v.preemptions,
        "prefix_hit_rate": v.prefix_hit_rate,
        "prefix_queries": v.prefix_queries,
        "prefix_hits": v.prefix_hits,
        "prompt_tokens": v.prompt_tokens,
        "generation_tokens": v.generation_tokens,
        "peak_kv_usage": v.peak_kv_usage,
        "peak_running": v.peak_running,
        "ttft_mean": ttft.mean if ttft else None,
        "reprefill": v.reprefill,
        "reprefill_max": v.reprefill_max,
    }


def _view(
    before: Metrics, after: Metrics, samples: list[Metrics], client: ClientTokens | None
) -> ServerView:
    def delta(key: str) -> float | None:
        a = _get(after, COUNTERS[key])
        return None if a is None else a - (_get(before, COUNTERS[key]) or 0.0)

    def peak(key: str) -> float | None:
        vals = [v for m in (*samples, after) if (v := _get(m, GAUGES[key])) is not None]
        return max(vals) if vals else None

    q, h = delta("prefix_queries"), delta("prefix_hits")
    pt, pc, pre = delta("prompt_tokens"), delta("prompt_cached"), delta("preemptions")
    ratio, ratio_max = reprefill_bounds(pre, pt, pc, client.max_context if client else 0)
    return ServerView(
        preemptions=pre,
        prefix_hit_rate=(h / q) if q and h is not None else None,
        prefix_queries=q,
        prefix_hits=h,
        peak_kv_usage=peak("kv_usage"),
        peak_running=peak("running"),
        peak_waiting=peak("waiting"),
        prompt_tokens=pt,
        generation_tokens=delta("generation_tokens"),
        prompt_cached=pc,
        reprefill=ratio,
        reprefill_max=ratio_max,
        client_prompt_tokens=client.prompt_tokens if client else None,
        histograms={
            k: d for k, name in HISTOGRAMS.items() if (d := histogram_delta(before, after, name))
        },
    )


class Scraper:
    """Scrapes ``/metrics`` once now (``scrape``), and every ``interval`` s in the background
    between ``start()`` and ``stop()`` (for peaks of the gauges).

    With ``replicas`` (default), each ``scrape()`` first asks the target for ``GET /fleet``;
    a servefleet gateway answers with its replicas, and then every replica's ``/metrics`` is
    scraped instead of the gateway's (the background samples reuse that list). A target
    without ``/fleet`` (vLLM, the sim-server: 404) is asked once and then scraped itself, as
    is a gateway none of whose replicas answers (their URLs may be the gateway's view, not
    reachable from here).

    ``token``: a gateway's admin token, sent with the target's own ``GET /fleet`` and ``GET
    /metrics`` (a gateway beyond loopback needs it), never to the replicas. A target that
    refuses ``/fleet`` for want of it is not scraped, and ``note`` says what to pass."""

    def __init__(
        self,
        base_url: str,
        session: aiohttp.ClientSession,
        interval: float = 0.5,
        *,
        replicas: bool = True,
        token: str | None = None,
    ):
        self.base = base_url.rstrip("/")
        self.url = self.base + "/metrics"
        self.session = session
        self.token = token
        self.interval = interval
        self.samples: list[Metrics] = []
        self.sample_times: list[float] = []
        """When each sample was taken (seconds since ``start(t0)``'s ``t0``)."""
        self._t0 = 0.0
        self.available = True
        self.note: str | None = None
        self.fleet: bool | None = None if replicas else False
        """Whether the target is a gateway whose replicas are scraped (None: not known yet)."""
        self.urls: list[str] = [self.url]
        """The ``/metrics`` URLs the last scrape read."""
        self._task: asyncio.Task | None = None

    async def scrape(self) -> Scrape | None:
        if not self.available:
            return None
        if self.fleet is not False:
            replicas = await self._discover()
            if not self.available:
                return None
            if replicas is not None:
                s = await self._scrape_replicas(replicas)
                if s is not None:
                    return s
        return await self._scrape_target()

    async def _discover(self) -> list[str] | None:
        """The replicas' ``/metrics`` URLs from ``GET /fleet``; None when the target has no
        fleet (then never asked again), refuses it (then nothing is scraped) or the answer
        failed (then the target is scraped)."""
        url = self.base + "/fleet"
        try:
            status, body = await get_json(self.session, url, token=self.token)
        except (aiohttp.ClientError, TimeoutError, OSError):
            if self.fleet is None:
                self.fleet = False
            return None
        if status in (404, 405):
            self.fleet = False
            return None
        if (why := refusal(status, url, self.token)) is not None:
            self.available, self.note = False, why
            return None
        if status != 200:
            return None
        reps = body.get("replicas") if isinstance(body, dict) else None
        if not isinstance(reps, list):
            self.fleet = False
            return None
        urls = [
            str(x["url"]).rstrip("/") + "/metrics"
            for x in reps
            if isinstance(x, dict) and isinstance(x.get("url"), str) and x["url"]
        ]
        return list(dict.fromkeys(urls))

    async def _scrape_replicas(self, urls: list[str], sampling: bool = False) -> Scrape | None:
        got = await asyncio.gather(*(self._get(u) for u in urls))
        parts = {u: m for u, m in zip(urls, got, strict=True) if isinstance(m, dict)}
        notes = [f"{u}: {m}" for u, m in zip(urls, got, strict=True) if isinstance(m, str)]
        if urls and not parts and not sampling and self.fleet is None:
            # the replicas are not reachable from here: the gateway's own /metrics, as before
            self.fleet = False
            self.note = f"no replica behind the gateway answered /metrics ({'; '.join(notes)})"
            return None
        if not sampling:
            self.fleet = True
            self.urls = urls
        return Scrape(parts, replicas=True, notes=notes)

    async def _get(self, url: str) -> Metrics | str:
        """The metrics at ``url``, or why not (the token goes to the target's own only)."""
        try:
            status, text = await get_text(
                self.session, url, token=self.token if url == self.url else None
            )
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            return f"GET /metrics failed: {e or type(e).__name__}"
        if status != 200:
            return f"GET /metrics: HTTP {status}"
        return parse_metrics(text)

    async def _scrape_target(self) -> Scrape | None:
        m = await self._get(self.url)
        if isinstance(m, str):
            self.available, self.note = False, m
            return None
        self.urls = [self.url]
        return Scrape({self.url: m}, notes=[self.note] if self.note else None)

    def start(self, t0: float | None = None) -> None:
        self.samples = []
        self.sample_times = []
        self._t0 = time.perf_counter() if t0 is None else t0
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
            t = time.perf_counter() - self._t0
            if self.fleet:
                m = await self._scrape_replicas(self.urls, sampling=True)
            else:
                m = await self._scrape_target()
            if m is None:
                return
            self.samples.append(m)
            self.sample_times.append(t)
