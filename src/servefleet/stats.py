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
* Per class and per session turn: the same summary over that group's requests (the turns
  count only requests that belong to a session).
* The knee of a sweep (``find_knee``) and the judge of a benchmark client's self-check
  (``judge``), which every command that reads a sweep or a point applies the same way.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

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


def parse_slo_classes(
    text: str | None, default: SLO, own: Mapping[str, SLO] | None = None
) -> dict[str, SLO] | None:
    """The classes an SLO applies to, each with its SLO, from ``--slo-classes``:
    ``qa,sessions`` (each class its own SLO from the workload spec, ``own``, else ``default``)
    or ``qa:ttft=1:itl=0.05,sessions:ttft=4`` (values given win). None: every request, pooled.
    ValueError on a malformed item."""
    if text is None or not text.strip():
        return None
    out: dict[str, SLO] = {}
    for item in text.split(","):
        name, *fields = [x.strip() for x in item.split(":")]
        if not name:
            raise ValueError(f"--slo-classes: an empty class name in {text!r}")
        base = (own or {}).get(name, default)
        values = {"ttft": base.ttft, "itl": base.itl}
        for f in fields:
            key, sep, value = f.partition("=")
            try:
                number = float(value)
            except ValueError:
                number = float("nan")
            if not sep or key not in values or not number > 0 or number == float("inf"):
                raise ValueError(
                    f"--slo-classes: {f!r} in {item!r}: give ttft=SECONDS or itl=SECONDS (> 0)"
                )
            values[key] = number
        out[name] = SLO(values["ttft"], values["itl"])
    return out


def slo_classes_text(classes: Mapping[str, SLO], default: SLO) -> str:
    """``--slo-classes`` for ``classes`` (values written only where they differ from
    ``default``): what a reproduce line carries."""
    items = []
    for name, slo in classes.items():
        extra = "".join(
            f":{k}={v:g}"
            for k, v, d in (("ttft", slo.ttft, default.ttft), ("itl", slo.itl, default.itl))
            if v is not None and v != d
        )
        items.append(name + extra)
    return ",".join(items)


def slo_failures(
    s: Summary,
    slo: SLO,
    max_error_share: float = DEFAULT_MAX_ERROR_RATE,
    classes: Mapping[str, SLO] | None = None,
) -> list[str]:
    """Why a point does not hold its SLOs (empty: it does): TTFT P95 and ITL P95 within them,
    and at most ``max_error_share`` of the requests failed, every request of the point
    counted. With ``classes`` (``parse_slo_classes``), each named class is judged on its own
    requests under its own SLO, and only those classes count."""
    if classes is not None:
        out = []
        for name, own in classes.items():
            part = s.by_class.get(name) if s.by_class else s
            if part is None:
                out.append(f"class {name}: no request")
                continue
            out += [f"class {name}: {w}" for w in slo_failures(part, own, max_error_share)]
        return out
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


def meets_slo(
    s: Summary,
    slo: SLO,
    max_error_share: float = DEFAULT_MAX_ERROR_RATE,
    classes: Mapping[str, SLO] | None = None,
) -> bool:
    """A point holds its SLOs (the SLO search's test): ``slo_failures`` finds nothing."""
    return not slo_failures(s, slo, max_error_share, classes)


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
        if any(r.turn > 0 for r in records):  # only the sessions' requests, turn by turn
            in_session = [r for r in records if r.session_id is not None]
            by_turn = _grouped(in_session, window, slo, class_slos, turn_group)
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


# -- the knee of a sweep ---------------------------------------------------------------
# Where throughput stops growing and latency explodes: the knee of a sweep.
#
# Rule (one for ``bench``, ``simulate``, ``report`` and ``plan``): walk the sweep in ascending
# load (concurrency or request rate). For each step from point i-1 to point i, compare what it
# bought with what it cost, as ratios:
#
#     gain  = throughput_i / throughput_{i-1}        (output tokens/s)
#     cost  = ttft_p95_i  / ttft_p95_{i-1}
#
# The knee is the first point i whose step costs much and buys little: TTFT P95 grew by more than
# ``min_latency_growth`` (50 %) **and** it grew at least ``elasticity`` (3) times faster than
# throughput in log terms, ``log(cost) >= elasticity × log(gain)`` (always true when throughput
# did not grow). Log ratios make the rule independent of the step size: doubling concurrency
# for +23 % throughput at 5.7 × the TTFT is ``log 5.7 / log 1.23 = 8.5``; on the rising part of
# a curve the ratio is below 1.
#
#     throughput                          TTFT P95
#       │           ●──●  ← knee             │              ●  ← knee
#       │       ●                            │
#       │   ●                                │  ●   ●   ●
#       └──────────── load                   └──────────── load


@dataclass(frozen=True, slots=True)
class KneeRule:
    elasticity: float = 3.0
    """TTFT P95 must grow at least this many times faster than throughput (log ratios)."""
    min_latency_growth: float = 0.5
    """... and by more than this fraction (a small latency change is never a knee)."""

    def describe(self) -> str:
        return (
            f"the knee is the first point whose step from the previous one grows TTFT P95 by "
            f"more than {self.min_latency_growth:.0%} and at least {self.elasticity:g}x faster "
            "than throughput (log ratios; docs/metrics.md)"
        )

    def is_knee(self, gain: float, cost: float) -> bool:
        """A step that multiplied throughput by ``gain`` and TTFT P95 by ``cost``."""
        if cost <= 1 + self.min_latency_growth:
            return False
        return gain <= 1 or math.log(cost) >= self.elasticity * math.log(gain)


def find_knee(
    loads: Sequence[float],
    throughput: Sequence[float],
    ttft_p95: Sequence[float | None],
    rule: KneeRule | None = None,
) -> int | None:
    """Index of the knee under ``rule`` (loads ascending), or None if the sweep never
    saturates. Steps with a missing or zero figure, or no load increase, are skipped."""
    rule = rule or KneeRule()
    for i in range(1, len(throughput)):
        t0, t1, l0, l1 = throughput[i - 1], throughput[i], ttft_p95[i - 1], ttft_p95[i]
        if loads[i] <= loads[i - 1] or not t0 or t0 <= 0 or l0 is None or l1 is None or l0 <= 0:
            continue
        if rule.is_knee(max(t1, 0.0) / t0, l1 / l0):
            return i
    return None


# -- the client's self-check judge ---------------------------------------------------------
# The readings that come with every benchmark result (measured by ``bench.selfcheck``) and
# the rule that judges them:
#
# * offered vs achieved rate: requests the schedule asked for inside the window, and those sent;
# * send-schedule lag: actual − scheduled send time, per request (P50/P99/max);
# * event-loop lag: how late a 5 ms ticker wakes up (P99/max) — a blocked loop delays timestamps;
# * client CPU: process CPU seconds ÷ wall seconds (1.0 = one core busy; the client is one
#   Python thread, so near 1.0 it is saturated);
# * run-queue wait: the share of the time the client was ready to run but other processes held
#   every core (Linux ``/proc/thread-self/schedstat``) — an oversubscribed machine.
#
# ``judge`` decides which readings matter. A client delay is only a bottleneck when it is a
# meaningful share (``MEANINGFUL_SHARE``) of the latencies it distorts: a request sent 8 ms late
# does not change a 22 s TTFT, but an event loop 5 ms late distorts 10 ms token gaps. Readings
# over their limits that do not matter are kept as ``notes``; those that do are ``warnings``
# (the point is then CLIENT BOTTLENECK).

LAG_P99_LIMIT = 0.005
LOOP_LAG_P99_LIMIT = 0.010
CPU_LIMIT = 0.9
ACHIEVED_MIN = 0.95
RUNQUEUE_LIMIT = 0.05
MEANINGFUL_SHARE = 0.1
"""A client delay matters when it exceeds this share of the latency it affects."""


@dataclass(slots=True)
class SelfCheck:
    offered_rate: float
    achieved_rate: float
    send_lag_p50: float | None
    send_lag_p99: float | None
    send_lag_max: float | None
    loop_lag_p99: float | None
    loop_lag_max: float | None
    client_cpu: float
    open_loop: bool
    warnings: list[str] = field(default_factory=list)
    """Client delays that matter for this point's latencies (it is client-bound)."""
    runqueue_wait: float | None = None
    """Share of the wall time the client's loop thread was ready to run but had no CPU (other
    processes had them): a busy machine, which delays every timestamp."""
    notes: list[str] = field(default_factory=list)
    """Readings over their limits that are too small, next to the latencies, to matter."""

    @property
    def client_bound(self) -> bool:
        return bool(self.warnings)

    def to_dict(self) -> dict:
        return asdict(self) | {"client_bound": self.client_bound}

    @classmethod
    def from_dict(cls, d: dict) -> SelfCheck:
        names = set(cls.__slots__)
        return cls(**{k: v for k, v in d.items() if k in names})


def _pct(a: Sequence[float], q: float) -> float | None:
    return float(np.percentile(a, q)) if len(a) else None


def evaluate(
    records: Sequence[RequestRecord],
    window: Window,
    loop_lags: Sequence[float],
    client_cpu: float,
    *,
    open_loop: bool,
    scheduled_in_window: int | None = None,
    runqueue_wait: float | None = None,
    ttft_p50: float | None = None,
    itl_p50: float | None = None,
) -> SelfCheck:
    """Pure: the self-checks of a point from its records and the monitors' readings, judged
    against its latencies (``judge``)."""
    length = max(window.length, 1e-9)
    sent = [r for r in records if window.start <= r.scheduled_time < window.end]
    offered = (scheduled_in_window if scheduled_in_window is not None else len(sent)) / length
    achieved = sum(1 for r in records if window.start <= r.send_time < window.end) / length
    lags = [r.send_time - r.scheduled_time for r in sent]
    c = SelfCheck(
        offered_rate=offered,
        achieved_rate=achieved,
        send_lag_p50=_pct(lags, 50),
        send_lag_p99=_pct(lags, 99),
        send_lag_max=max(lags) if lags else None,
        loop_lag_p99=_pct(loop_lags, 99),
        loop_lag_max=max(loop_lags) if loop_lags else None,
        client_cpu=client_cpu,
        open_loop=open_loop,
        runqueue_wait=runqueue_wait,
    )
    return judge(c, ttft_p50, itl_p50)


def judge(c: SelfCheck, ttft_p50: float | None, itl_p50: float | None) -> SelfCheck:
    """Sort the readings over their limits into ``warnings`` (they matter for these latencies)
    and ``notes`` (they do not); returns ``c``, changed in place.

    Rule: the achieved rate below 95 % of the offered one always matters (the server did not
    see the load asked for). The send-schedule lag P99 (> 5 ms, open loop) matters when it is
    over 10 % of the TTFT P50 (requests leave late by a share of what they take). The event-loop
    lag P99 (> 10 ms) matters when it is over 10 % of the smallest of TTFT P50 and ITL P50 (every
    timestamp may be that late). High client CPU and CPU wait are causes, not effects: they
    matter only with one of the delays above, and are notes otherwise. Without latencies (no
    request succeeded) every reading over its limit matters."""
    c.warnings, c.notes = [], []

    def matters(delay: float, *latencies: float | None) -> bool:
        lat = [x for x in latencies if x is not None and x > 0]
        return not lat or delay > MEANINGFUL_SHARE * min(lat)

    def put(ok: bool, text: str) -> None:
        (c.warnings if ok else c.notes).append(text)

    if c.open_loop and c.offered_rate > 0 and c.achieved_rate < ACHIEVED_MIN * c.offered_rate:
        c.warnings.append(f"achieved {c.achieved_rate:.2f} req/s of {c.offered_rate:.2f} offered")
    if c.open_loop and c.send_lag_p99 is not None and c.send_lag_p99 > LAG_P99_LIMIT:
        put(
            matters(c.send_lag_p99, ttft_p50),
            f"send-schedule lag P99 {c.send_lag_p99 * 1000:.1f} ms > "
            f"{LAG_P99_LIMIT * 1000:g} ms: requests left later than the workload asked"
            + _beside(ttft_p50, "TTFT"),
        )
    if c.loop_lag_p99 is not None and c.loop_lag_p99 > LOOP_LAG_P99_LIMIT:
        put(
            matters(c.loop_lag_p99, ttft_p50, itl_p50),
            f"event-loop lag P99 {c.loop_lag_p99 * 1000:.1f} ms > "
            f"{LOOP_LAG_P99_LIMIT * 1000:g} ms: timestamps are late by up to that much"
            + _beside(itl_p50, "ITL"),
        )
    delayed = bool(c.warnings)
    if c.runqueue_wait is not None and c.runqueue_wait > RUNQUEUE_LIMIT:
        put(
            delayed or ttft_p50 is None,
            f"the client waited for a CPU {c.runqueue_wait:.0%} of the time: other processes "
            "(the server?) hold the cores",
        )
    if c.client_cpu > CPU_LIMIT:
        put(delayed or ttft_p50 is None, f"client CPU {c.client_cpu:.0%} of one core")
    return c


def _beside(latency: float | None, name: str) -> str:
    return "" if latency is None else f" (the {name} P50 is {latency * 1000:,.1f} ms)"
