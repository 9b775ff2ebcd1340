"""Metrics derived from request records — the definitions of docs/metrics.md, in one place.

* TTFT: first chunk carrying output text − send time.
* ITL: gaps between consecutive output tokens; a chunk of k tokens that arrives Δ after the
  previous chunk contributes k gaps of Δ/k. Chunk gaps (one per chunk) are reported apart.
* TPOT: (E2E − TTFT) / (n − 1) per request with n >= 2 output tokens.
* E2E: end − send time.
* Throughput: output tokens whose chunk arrived inside the measurement window, ÷ its length;
  requests that ended inside the window, ÷ its length.
* Goodput: requests/s that ended inside the window and met every SLO (TTFT, and TPOT as the
  per-request inter-token latency).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from servefleet.records import RequestRecord

PERCENTILES = (50, 90, 95, 99)


@dataclass(frozen=True, slots=True)
class Distribution:
    count: int
    mean: float | None
    p50: float | None
    p90: float | None
    p95: float | None
    p99: float | None
    max: float | None

    @classmethod
    def of(cls, values: Sequence[float] | np.ndarray) -> Distribution:
        a = np.asarray(values, dtype=float)
        if a.size == 0:
            return cls(0, None, None, None, None, None, None)
        p = np.percentile(a, PERCENTILES)
        return cls(int(a.size), float(a.mean()), *(float(x) for x in p), float(a.max()))

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}


@dataclass(frozen=True, slots=True)
class SLO:
    ttft: float | None = 2.0
    """Seconds, per request."""
    itl: float | None = 0.1
    """Seconds, applied to each request's TPOT."""

    def met(self, r: RequestRecord) -> bool:
        if not r.ok or r.ttft is None:
            return False
        if self.ttft is not None and r.ttft > self.ttft:
            return False
        tpot = r.tpot
        return not (self.itl is not None and tpot is not None and tpot > self.itl)


@dataclass(frozen=True, slots=True)
class Window:
    start: float
    end: float

    @property
    def length(self) -> float:
        return self.end - self.start


@dataclass(slots=True)
class Summary:
    window: Window
    num_requests: int
    num_ok: int
    errors: dict[str, int]
    request_throughput: float
    output_throughput: float
    total_throughput: float
    goodput: float
    ttft: Distribution
    itl: Distribution
    chunk_gap: Distribution
    tpot: Distribution
    e2e_latency: Distribution
    queue_time: Distribution
    prompt_tokens: Distribution
    output_tokens: Distribution
    cached_ratio: float | None
    """Cached prompt tokens ÷ prompt tokens (prefix-cache hit rate seen by requests)."""
    preemptions: int | None
    recomputed_ratio: float | None
    """Re-prefill ratio: tokens prefilled again after a preemption ÷ all tokens prefilled
    (prompt tokens not found in the prefix cache, plus those recomputed)."""
    slo: SLO = field(default_factory=SLO)
    error_kinds: dict[str, int] = field(default_factory=dict)
    """Failed requests by kind (``error_kind``): ``HTTP 429``, ``connect``, ``timeout`` ..."""

    def to_dict(self) -> dict:
        out = {}
        for k in self.__slots__:
            v = getattr(self, k)
            if isinstance(v, Distribution):
                v = v.to_dict()
            elif isinstance(v, Window | SLO):
                v = {f: getattr(v, f) for f in v.__slots__}
            out[k] = v
        return out


_HTTP = re.compile(r"^HTTP (\d{3})")


def error_kind(r: RequestRecord) -> str:
    """The kind of a failed request: ``HTTP <code>`` for an HTTP status, else the error's
    prefix before ``:`` (``connect``, ``timeout``, ``stream``, ``disconnected``, ``aborted``),
    else the status."""
    msg = r.error or ""
    m = _HTTP.match(msg)
    if m:
        return f"HTTP {m.group(1)}"
    head = msg.split(":", 1)[0].strip()
    return head if head and len(head) <= 24 and ":" in msg else r.status


def meets_slo(s: Summary, slo: SLO, max_error_share: float = 0.01) -> bool:
    """A point holds its SLOs: TTFT P95 and ITL P95 within them, and at most
    ``max_error_share`` of the requests failed (the SLO search's test)."""
    if s.num_ok == 0 or s.num_requests == 0:
        return False
    if (s.num_requests - s.num_ok) / s.num_requests > max_error_share:
        return False
    if slo.ttft is not None and (s.ttft.p95 is None or s.ttft.p95 > slo.ttft):
        return False
    return not (slo.itl is not None and s.itl.p95 is not None and s.itl.p95 > slo.itl)


def token_gaps(r: RequestRecord) -> tuple[np.ndarray, np.ndarray]:
    """(per-token ITL gaps, per-chunk gaps) of one request."""
    if len(r.chunk_times) < 2:
        return np.empty(0), np.empty(0)
    t = np.asarray(r.chunk_times, dtype=float)
    k = np.asarray(r.chunk_tokens[1:], dtype=float)
    gaps = np.diff(t)
    k = np.maximum(k, 1.0)
    return np.repeat(gaps / k, k.astype(int)), gaps


def _tokens_in_window(records: Sequence[RequestRecord], w: Window) -> int:
    n = 0
    for r in records:
        if not r.chunk_times:
            continue
        t = np.asarray(r.chunk_times)
        mask = (t >= w.start) & (t < w.end)
        n += int(np.asarray(r.chunk_tokens)[mask].sum())
    return n


def summarize(
    records: Sequence[RequestRecord], window: Window | None = None, slo: SLO | None = None
) -> Summary:
    """Summarise the requests sent inside ``window`` (default: the whole run)."""
    slo = slo or SLO()
    if window is None:
        starts = [r.send_time for r in records] or [0.0]
        ends = [r.end_time for r in records if r.end_time is not None] or starts
        window = Window(min(starts), max(max(ends), min(starts) + 1e-9))
    sent = [r for r in records if window.start <= r.send_time < window.end]
    ok = [r for r in sent if r.ok]
    ended = [
        r
        for r in records
        if r.ok and r.end_time is not None and window.start <= r.end_time < window.end
    ]
    length = max(window.length, 1e-9)
    itl_parts, gap_parts = [], []
    for r in ok:
        a, b = token_gaps(r)
        itl_parts.append(a)
        gap_parts.append(b)
    out_tokens = _tokens_in_window(records, window)
    in_tokens = sum(r.prompt_tokens for r in ended)
    prompt_sum = sum(r.prompt_tokens for r in ok)
    cached = [r.cached_tokens for r in ok if r.cached_tokens is not None]
    recomputed = [r.recomputed_tokens for r in ok if r.recomputed_tokens is not None]
    preempt = [r.preemptions for r in sent if r.preemptions is not None]
    return Summary(
        window=window,
        num_requests=len(sent),
        num_ok=len(ok),
        errors=dict(Counter(r.error or r.status for r in sent if not r.ok)),
        request_throughput=len(ended) / length,
        output_throughput=out_tokens / length,
        total_throughput=(out_tokens + in_tokens) / length,
        goodput=sum(1 for r in ended if slo.met(r)) / length,
        ttft=Distribution.of([r.ttft for r in ok if r.ttft is not None]),
        itl=Distribution.of(np.concatenate(itl_parts) if itl_parts else []),
        chunk_gap=Distribution.of(np.concatenate(gap_parts) if gap_parts else []),
        tpot=Distribution.of([r.tpot for r in ok if r.tpot is not None]),
        e2e_latency=Distribution.of([r.e2e_latency for r in ok if r.e2e_latency is not None]),
        queue_time=Distribution.of([r.queue_time for r in ok if r.queue_time is not None]),
        prompt_tokens=Distribution.of([r.prompt_tokens for r in ok]),
        output_tokens=Distribution.of([r.output_tokens for r in ok]),
        cached_ratio=(sum(cached) / prompt_sum) if cached and prompt_sum else None,
        preemptions=sum(preempt) if preempt else None,
        recomputed_ratio=_ratio(sum(recomputed), prompt_sum - sum(cached) + sum(recomputed))
        if recomputed
        else None,
        slo=slo,
        error_kinds=dict(Counter(error_kind(r) for r in sent if not r.ok)),
    )


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None
