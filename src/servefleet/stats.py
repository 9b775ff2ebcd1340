"""Metrics derived from request records — the definitions of docs/metrics.md, in one place.

* TTFT: first chunk carrying output text − send time.
* ITL: gaps between consecutive output tokens; a chunk of k tokens that arrives Δ after the
  previous chunk contributes k gaps of Δ/k. Chunk gaps (one per chunk) are reported apart.
* TPOT: (E2E − TTFT) / (n − 1) per request with n >= 2 output tokens.
* E2E: end − send time.
* Throughput: output tokens whose chunk arrived inside the measurement window, ÷ its length;
  requests that ended inside the window, ÷ its length.
* Goodput: requests/s that ended inside the window and met every SLO (TTFT, and TPOT as the
  per-request inter-token latency); each request is judged by its class's SLOs.
* Counts (sent, ok, failed by kind, cancelled) cover *every* request of the point, warm-up and
  cool-down included: the window only selects the requests whose latencies are measured.
* Per class and per session turn: the same summary over that group's requests.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike

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


def class_slos(workload: Mapping | None, default: SLO) -> dict[str, SLO]:
    """The SLOs of the classes that set their own (``classes.<name>.slo`` of a workload spec,
    as a dict: ``WorkloadSpec.model_dump()`` or a run's summary.json); a field a class leaves
    out is the default's."""
    out = {}
    for name, c in ((workload or {}).get("classes") or {}).items():
        s = (c or {}).get("slo") if isinstance(c, Mapping) else None
        if s:
            out[name] = SLO(
                s.get("ttft") if s.get("ttft") is not None else default.ttft,
                s.get("itl") if s.get("itl") is not None else default.itl,
            )
    return out


@dataclass(frozen=True, slots=True)
class Window:
    start: float
    end: float

    @property
    def length(self) -> float:
        return self.end - self.start


CANCELLED = "aborted: interrupted"
"""The error of a request the client itself cancelled (Ctrl-C): not the server's failure."""

DEFAULT_MAX_ERROR_RATE = 0.01


@dataclass(slots=True)
class Summary:
    window: Window
    num_requests: int
    """Every request sent during the point, warm-up and cool-down included."""
    num_ok: int
    errors: dict[str, int]
    """Failed requests (whole point) by error message."""
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
    """Failed requests (whole point) by kind (``error_kind``): ``HTTP 429``, ``timeout`` ..."""
    num_failed: int = 0
    """Requests that failed (whole point): an error, or aborted by the drain timeout."""
    num_cancelled: int = 0
    """Requests the client cancelled (Ctrl-C): counted apart, never against the server."""
    window_requests: int = 0
    """Requests sent inside the window: the sample the latency percentiles are taken over."""
    window_ok: int = 0
    by_class: dict[str, Summary] = field(default_factory=dict)
    """The same summary over each workload class's requests (with that class's SLOs)."""
    by_turn: dict[str, Summary] = field(default_factory=dict)
    """... and over each session turn (``turn 1``, ``turn 2`` ...; only with sessions)."""

    @property
    def error_rate(self) -> float:
        """Failed ÷ requests the server was asked to finish (cancelled ones left out)."""
        n = self.num_requests - self.num_cancelled
        return self.num_failed / n if n > 0 else 0.0

    def failed_point(self, max_error_rate: float = DEFAULT_MAX_ERROR_RATE) -> bool:
        """The point failed: more than ``max_error_rate`` of its requests failed, or none of
        those the server was asked to finish succeeded (cancelled ones left out)."""
        asked = self.num_requests - self.num_cancelled
        return asked > 0 and (self.error_rate > max_error_rate or self.num_ok == 0)

    @classmethod
    def from_dict(cls, d: Mapping) -> Summary:
        """The inverse of ``to_dict`` (a point's summary as summary.json has it)."""
        kw: dict = {}
        for k in cls.__slots__:
            if k not in d:
                continue
            v = d[k]
            if k == "window":
                v = Window(v["start"], v["end"])
            elif k == "slo":
                v = SLO(v.get("ttft"), v.get("itl"))
            elif k in ("by_class", "by_turn"):
                v = {name: cls.from_dict(g) for name, g in v.items()}
            elif k in _DISTRIBUTIONS:
                v = Distribution(**v)
            kw[k] = v
        return cls(**kw)

    def to_dict(self) -> dict:
        out = {}
        for k in self.__slots__:
            v = getattr(self, k)
            if isinstance(v, Distribution):
                v = v.to_dict()
            elif isinstance(v, Window | SLO):
                v = {f: getattr(v, f) for f in v.__slots__}
            elif k in ("by_class", "by_turn"):
                v = {name: g.to_dict() for name, g in v.items()}
            out[k] = v
        out["error_rate"] = self.error_rate
        return out


_DISTRIBUTIONS = frozenset(
    k for k, t in Summary.__annotations__.items() if t in ("Distribution", Distribution)
)
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


def slo_failures(
    s: Summary, slo: SLO, max_error_share: float = DEFAULT_MAX_ERROR_RATE
) -> list[str]:
    """Why a point does not hold its SLOs (empty: it does): TTFT P95 and ITL P95 within them,
    and at most ``max_error_share`` of the requests failed, every request of the point
    counted."""
    out = []
    if s.num_requests == 0:
        return ["no request"]
    if s.num_ok == 0:
        out.append("no request succeeded")
    elif s.error_rate > max_error_share:
        out.append(f"errors {s.error_rate:.1%} > {max_error_share:.0%}")
    if s.num_ok and s.ttft.p95 is None:
        out.append("no latency measured (no request succeeded inside the window)")
    if slo.ttft is not None and s.ttft.p95 is not None and s.ttft.p95 > slo.ttft:
        out.append(f"TTFT P95 {_secs(s.ttft.p95)} > {_secs(slo.ttft)}")
    if slo.itl is not None and s.itl.p95 is not None and s.itl.p95 > slo.itl:
        out.append(f"ITL P95 {_secs(s.itl.p95)} > {_secs(slo.itl)}")
    return out


def meets_slo(s: Summary, slo: SLO, max_error_share: float = DEFAULT_MAX_ERROR_RATE) -> bool:
    """A point holds its SLOs (the SLO search's test): ``slo_failures`` finds nothing."""
    return not slo_failures(s, slo, max_error_share)


def _secs(v: float) -> str:
    return f"{v:.3g} s" if v >= 1 else f"{v * 1000:.3g} ms"


def token_gaps(r: RequestRecord) -> tuple[np.ndarray, np.ndarray]:
    """(per-token ITL gaps, per-chunk gaps) of one request."""
    return token_gaps_of(r.chunk_times, r.chunk_tokens, [len(r.chunk_times)])


def token_gaps_of(
    times: ArrayLike, tokens: ArrayLike, counts: ArrayLike
) -> tuple[np.ndarray, np.ndarray]:
    """(per-token ITL gaps, per-chunk gaps) of several requests at once, in their order: their
    chunk times and chunk tokens back to back, ``counts`` chunks each. The gaps are those
    between each request's consecutive chunks; a chunk of ``k`` tokens after a gap ``g`` makes
    ``k`` ITL gaps of ``g / k`` (one at least)."""
    t = np.asarray(times, dtype=float)
    if t.size < 2:
        return np.empty(0), np.empty(0)
    gaps = np.diff(t)
    k = np.asarray(tokens, dtype=float)[1:]
    n = np.asarray(counts, dtype=np.int64)
    starts = np.cumsum(n[n > 0])[:-1]  # each later request's first chunk
    if starts.size:
        keep = np.ones(gaps.size, dtype=bool)
        keep[starts - 1] = False  # no gap between two requests
        gaps, k = gaps[keep], k[keep]
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


MAX_TURN_GROUP = 10
"""Turns from this one on are grouped as ``turn 10+``."""


def turn_group(r: RequestRecord) -> str:
    """The session-turn group of a request: ``turn 1`` for the first turn of a session ..."""
    k = r.turn + 1
    return f"turn {k}" if k < MAX_TURN_GROUP else f"turn {MAX_TURN_GROUP}+"


def cancelled(r: RequestRecord) -> bool:
    return r.status == "aborted" and r.error == CANCELLED


def summarize(
    records: Sequence[RequestRecord],
    window: Window | None = None,
    slo: SLO | None = None,
    *,
    class_slos: Mapping[str, SLO] | None = None,
    groups: bool = True,
) -> Summary:
    """Summarise a point: counts over every record, latencies over the requests sent inside
    ``window`` (default: the whole run). ``class_slos`` gives classes their own SLOs (else
    ``slo``); ``groups`` adds the summaries per class and per session turn."""
    slo = slo or SLO()
    class_slos = class_slos or {}
    if window is None:
        starts = [r.send_time for r in records] or [0.0]
        ends = [r.end_time for r in records if r.end_time is not None] or starts
        window = Window(min(starts), max(max(ends), min(starts) + 1e-9))
    sent = [r for r in records if window.start <= r.send_time < window.end]
    ok = [r for r in sent if r.ok]
    n_ok = sum(1 for r in records if r.ok)
    n_cancelled = sum(1 for r in records if cancelled(r))
    failed = [r for r in records if not r.ok and not cancelled(r)]
    ended = [
        r
        for r in records
        if r.ok and r.end_time is not None and window.start <= r.end_time < window.end
    ]
    length = max(window.length, 1e-9)
    itl, gaps = token_gaps_of(
        [t for r in ok for t in r.chunk_times],
        [k for r in ok for k in r.chunk_tokens],
        [len(r.chunk_times) for r in ok],
    )
    out_tokens = _tokens_in_window(records, window)
    in_tokens = sum(r.prompt_tokens for r in ended)
    prompt_sum = sum(r.prompt_tokens for r in ok)
    cached = [r.cached_tokens for r in ok if r.cached_tokens is not None]
    recomputed = [r.recomputed_tokens for r in ok if r.recomputed_tokens is not None]
    preempt = [r.preemptions for r in sent if r.preemptions is not None]
    by_class: dict[str, Summary] = {}
    by_turn: dict[str, Summary] = {}
    if groups:
        by_class = _grouped(records, window, slo, class_slos, lambda r: r.class_name)
        if any(r.turn > 0 for r in records):
            by_turn = _grouped(records, window, slo, class_slos, turn_group)
    return Summary(
        window=window,
        num_requests=len(records),
        num_ok=n_ok,
        errors=dict(Counter(r.error or r.status for r in failed)),
        request_throughput=len(ended) / length,
        output_throughput=out_tokens / length,
        total_throughput=(out_tokens + in_tokens) / length,
        goodput=sum(1 for r in ended if class_slos.get(r.class_name, slo).met(r)) / length,
        ttft=Distribution.of([r.ttft for r in ok if r.ttft is not None]),
        itl=Distribution.of(itl),
        chunk_gap=Distribution.of(gaps),
        tpot=Distribution.of([r.tpot for r in ok if r.tpot is not None]),
        e2e_latency=Distribution.of([r.e2e_latency for r in ok if r.e2e_latency is not None]),
        queue_time=Distribution.of([r.queue_time for r in ok if r.queue_time is not None]),
        prompt_tokens=Distribution.of([r.prompt_tokens for r in ok]),
        output_tokens=Distribution.of([r.output_tokens for r in ok]),
        cached_ratio=ratio(sum(cached), prompt_sum) if cached else None,
        preemptions=sum(preempt) if preempt else None,
        recomputed_ratio=ratio(sum(recomputed), prompt_sum - sum(cached) + sum(recomputed))
        if recomputed
        else None,
        slo=slo,
        error_kinds=dict(Counter(error_kind(r) for r in failed)),
        num_failed=len(failed),
        num_cancelled=n_cancelled,
        window_requests=len(sent),
        window_ok=len(ok),
        by_class=by_class,
        by_turn=by_turn,
    )


def _grouped(records, window, slo, class_slos, key) -> dict[str, Summary]:
    parts: dict[str, list[RequestRecord]] = {}
    for r in records:
        parts.setdefault(key(r), []).append(r)
    if len(parts) < 2:
        return {}  # one group: the point's own summary says it all
    return {
        name: summarize(rs, window, class_slos.get(name, slo), class_slos=class_slos, groups=False)
        for name, rs in sorted(parts.items(), key=lambda kv: group_order(kv[0]))
    }


def group_order(name: str) -> tuple:
    """The sort key of a group's name in ``by_class`` / ``by_turn``: session turns by their
    number (``turn 2`` before ``turn 10+``), then classes by name."""
    m = re.fullmatch(r"turn (\d+)\+?", name)
    return (0, int(m.group(1)), "") if m else (1, 0, name)


def ratio(num: float, den: float) -> float | None:
    """``num / den``, or None when ``den`` is not positive (a share of nothing is unknown, not
    0): how a ``Summary``'s ratios are computed (here and in ``stream_stats``)."""
    return num / den if den > 0 else None
