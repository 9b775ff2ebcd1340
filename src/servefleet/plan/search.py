"""The search: configurations (TP × replicas × flags × routing policy), each simulated with
``sim.runner.simulate_point`` at open-loop rates, for the highest rate whose SLOs hold.

Rate search (per candidate): start at an estimate, double (or halve) until the SLO flips, then
bisect geometrically until the bracket is within ``rel_tol``. Rates are rounded to three
significant digits, so that the rate printed is the rate simulated and ``servefleet simulate
--rate R`` reproduces the point exactly; a rate already simulated is never simulated again.

Each point simulates ``warmup + window`` seconds of arrivals. The warm-up of a candidate is
the time its longest requests take by the cost model (``settle_time``): before that the fleet
is still filling and throughput would read low. For a workload with bursts the window is a
whole number of burst periods (at that rate), so every point measures the same number of
bursts; for a trace, the window ends with the trace.

How a (candidate, rate) is judged — one short point, or long points on several seeds — is a
``probes.Probe``; ``runner.Runner`` advances many searches at once in worker processes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from servefleet.records import RequestRecord
from servefleet.sim.deployment import Deployment
from servefleet.sim.runner import Load, PointResult, simulate_point
from servefleet.stats import SLO, Summary, Window, token_gaps
from servefleet.workload import WorkloadSpec

from . import sustain
from .flags import Flags
from .profile import WorkloadProfile
from .sustain import Trend


@dataclass(frozen=True, slots=True)
class SLOTarget:
    ttft: float | None = 2.0
    itl: float | None = 0.1
    percentile: float = 95.0
    classes: frozenset[str] | None = None
    """Classes the SLO applies to, each judged on its own requests (None: every request,
    pooled)."""
    limits: tuple[tuple[str, float | None, float | None], ...] = ()
    """(class, TTFT, ITL) of named classes whose SLO differs from ``ttft``/``itl``
    (``--slo-classes qa:ttft=1``, or the workload spec's ``classes.<name>.slo``)."""

    def stats_slo(self) -> SLO:
        """The per-request SLO of goodput (TTFT, and ITL applied to each request's TPOT)."""
        return SLO(self.ttft, self.itl)

    def limits_of(self, name: str | None) -> tuple[float | None, float | None]:
        """(TTFT, ITL) limits of class ``name`` (None: the pooled SLO)."""
        for n, t, i in self.limits:
            if n == name:
                return t, i
        return self.ttft, self.itl

    def class_slos(self) -> dict[str, SLO]:
        """The named classes with SLO values of their own, as ``stats`` SLOs (for goodput)."""
        return {n: SLO(t, i) for n, t, i in self.limits}

    def slo_classes(self) -> dict[str, SLO] | None:
        """Every named class with its SLO (``stats.slo_failures``' ``classes``), sorted."""
        if self.classes is None:
            return None
        return {n: SLO(*self.limits_of(n)) for n in sorted(self.classes)}

    def describe(self) -> str:
        parts = []
        if self.ttft is not None:
            parts.append(f"TTFT P{self.percentile:g} <= {self.ttft:g} s")
        if self.itl is not None:
            parts.append(f"ITL P{self.percentile:g} <= {self.itl * 1e3:g} ms")
        scope = ""
        if self.classes is not None:
            own = "; ".join(
                f"{n}: TTFT <= {t:g} s, ITL <= {i * 1e3:g} ms"
                for n, t, i in self.limits
                if t is not None and i is not None
            )
            scope = f" (classes {', '.join(sorted(self.classes))}, each on its own" + (
                f"; {own})" if own else ")"
            )
        return " and ".join(parts) + scope if parts else "no SLO"


@dataclass(frozen=True, slots=True)
class SearchSettings:
    window: float = 60.0
    """Measured simulated seconds per point (stretched to whole burst periods)."""
    warmup: float | None = None
    """Warm-up seconds per point (None: each candidate's settle time, within the bounds
    below)."""
    min_warmup: float = 10.0
    max_warmup: float = 60.0
    seed: int = 0
    rel_tol: float = 0.1
    min_rate: float = 0.05
    max_rate: float = 10_000.0
    max_window: float = 900.0
    """Longest screening window; with bursts it bounds how low the rate goes (one period)."""
    long_window: float = 300.0
    """Sustainability (``probes.LongProbe``): the least measured seconds of a long point."""
    long_e2e_multiple: float = 10.0
    """... and at least this many times the P99 end-to-end latency at the screened rate."""
    long_warmup: float = 60.0
    """Warm-up of a long point (at least the candidate's own)."""
    long_seeds: tuple[int, ...] = (101,)
    """Seeds of the sustainability search, added to ``seed``."""
    verify_window: float = 600.0
    verify_seeds: tuple[int, ...] = (201, 202, 203)
    """Fresh seeds (added to ``seed``) the chosen rate is re-checked on before it is printed."""
    verify_steps: int = 4
    """Steps of ``VERIFY_STEP`` down the verification may take before it gives up."""
    sustain: bool = True
    """False: screening only (the 60 s window decides; for quick looks and tests)."""

    def lowest_rate(self, profile: WorkloadProfile) -> float:
        """``min_rate``, or higher where one burst period would not fit in ``max_window``."""
        b = profile.burst
        if b is None or b.period is None or not profile.nominal_rate:
            return self.min_rate
        return max(self.min_rate, b.period * profile.nominal_rate / self.max_window)


@dataclass(frozen=True, slots=True)
class Candidate:
    name: str
    """e.g. ``4 x TP=2``."""
    variant: str
    """``planner flags``, ``vLLM defaults``, ..."""
    deployment: Deployment
    flags: Flags
    policy: str
    warmup: float = 10.0
    """Simulated seconds left out at the start of each point."""
    long_replicas: int = 0
    """Replicas of the ``long`` pool (the last ones), for a length-pools policy."""

    @property
    def label(self) -> str:
        return f"{self.name} · {self.variant}"


@dataclass(slots=True)
class Outcome:
    """One simulated point, reduced to what the plan shows (records stay in the worker)."""

    rate: float
    duration: float
    warmup: float
    summary: Summary
    ttft: float | None
    """TTFT at the SLO percentile over the SLO's classes."""
    itl: float | None
    ok: bool
    why: str
    miss_share: float
    """Share of the SLO's requests over the TTFT limit, or of their token gaps over the ITL
    limit, whichever is larger (1.0 when nothing finished)."""
    peak_kv_usage: float
    prefix_hit_rate: float | None
    max_in_flight: int
    """Most requests in flight on one replica at any moment."""
    per_class: dict[str, dict]
    wall: float
    cpu: float = 0.0
    """CPU seconds the point took (its simulation and reduction)."""
    seed: int = 0
    long: bool = False
    """Judged by the sustainability criterion (``sustain``), not the SLO alone."""
    finished_share: float = 1.0
    """Requests finished inside the window ÷ sent inside it."""
    trend: Trend | None = None
    stopped_at: float | None = None
    slo_class: str | None = None
    """The named class ``ttft`` and ``itl`` are of (None: every request, pooled)."""

    def to_dict(self) -> dict:
        return {
            "rate": self.rate,
            "seed": self.seed,
            "duration": self.duration,
            "warmup": self.warmup,
            "long": self.long,
            "finished_share": self.finished_share,
            "queue_trend": None
            if self.trend is None
            else {
                "bin_means": list(self.trend.means),
                "slope_per_s": self.trend.slope,
                "growth": self.trend.growth,
                "bound": self.trend.bound,
                "rising": self.trend.rising,
            },
            "stopped_at": self.stopped_at,
            "slo_ok": self.ok,
            "slo_check": self.why,
            "miss_share": self.miss_share,
            "slo_class": self.slo_class,
            "ttft_at_percentile": self.ttft,
            "itl_at_percentile": self.itl,
            "peak_kv_usage": self.peak_kv_usage,
            "prefix_hit_rate": self.prefix_hit_rate,
            "max_in_flight_per_replica": self.max_in_flight,
            "per_class": self.per_class,
            "summary": self.summary.to_dict(),
            "wall_seconds": self.wall,
            "cpu_seconds": self.cpu,
        }


@dataclass(slots=True)
class CandidateResult:
    candidate: Candidate
    points: list[Outcome] = field(default_factory=list)
    wall: float = 0.0
    futile: bool = False
    """The search stopped going down: lower rates did not get closer to the SLO."""

    @property
    def best(self) -> Outcome | None:
        ok = [p for p in self.points if p.ok]
        return max(ok, key=lambda p: p.rate) if ok else None

    @property
    def max_rate(self) -> float:
        b = self.best
        return b.rate if b else 0.0

    @property
    def lowest(self) -> Outcome | None:
        return min(self.points, key=lambda p: p.rate) if self.points else None


# ---- one point ----------------------------------------------------------------------------------


def nice(rate: float) -> float:
    """Three significant digits: the rate that is simulated and printed."""
    return float(f"{rate:.3g}")


def point_timing(
    profile: WorkloadProfile, rate: float, window: float, warmup: float
) -> tuple[float, float]:
    """(duration, warm-up) of a point at ``rate`` measuring at least ``window`` seconds."""
    period = profile.burst.period_at(rate, profile.nominal_rate) if profile.burst else None
    if period:
        window = period * max(1, math.ceil(window / period))
    duration = warmup + window
    if profile.trace_records:
        span = (profile.trace_records - 1) / rate
        duration = min(duration, span)
        warmup = min(warmup, duration / 5)
    return round(duration, 1), round(warmup, 1)


def percentile(values: Sequence[float] | np.ndarray, pct: float) -> float | None:
    a = np.asarray(values, dtype=float)
    return float(np.percentile(a, pct)) if a.size else None


def _scoped(
    summary: Summary, records: list[RequestRecord], slo: SLOTarget, window: Window | None = None
) -> tuple[float | None, float | None, float, str | None]:
    """(TTFT, ITL) at the SLO percentile, the share of requests (TTFT) or token gaps (ITL)
    beyond the SLO, the larger of the two, and the class they are of — from the same requests
    ``summarize`` counts (sent inside the window, finished ok); ``window``: a part of the
    summary's window instead. With named classes each class is judged on its own requests
    against its own limits, and the figures are the worst class's (the one furthest over, or
    closest to, its limits; a class with no request finished is the worst of all)."""
    w = window or summary.window
    sent = [r for r in records if r.ok and w.start <= r.send_time < w.end]
    key = f"p{slo.percentile:g}"
    if slo.classes is None:
        groups: list[tuple[str | None, list[RequestRecord]]] = [(None, sent)]
    else:
        groups = [(n, [r for r in sent if r.class_name == n]) for n in sorted(slo.classes)]
    worst: tuple[float, float | None, float | None, str | None] | None = None
    miss = 0.0
    for name, mine in groups:
        lt, li = slo.limits_of(name)
        ttfts = np.array([r.ttft for r in mine if r.ttft is not None], dtype=float)
        gaps = [token_gaps(r)[0] for r in mine]
        itls = np.concatenate(gaps) if gaps else np.empty(0)
        if lt is not None and ttfts.size:
            miss = max(miss, float((ttfts > lt).mean()))
        if li is not None and itls.size:
            miss = max(miss, float((itls > li).mean()))
        if window is None and name is None and key in ("p50", "p90", "p95", "p99"):
            t, i = getattr(summary.ttft, key), getattr(summary.itl, key)
        else:
            t, i = percentile(ttfts, slo.percentile), percentile(itls, slo.percentile)
        ratio = (
            math.inf
            if t is None
            else max(t / lt if lt else 0.0, (i / li if i is not None else math.inf) if li else 0.0)
        )
        if worst is None or ratio > worst[0]:
            worst = (ratio, t, i, name)
    assert worst is not None
    return worst[1], worst[2], miss, worst[3]


def _per_class(records: list[RequestRecord], w: Window, pct: float) -> dict[str, dict]:
    by: dict[str, list[RequestRecord]] = {}
    for r in records:
        if r.ok and w.start <= r.send_time < w.end:
            by.setdefault(r.class_name, []).append(r)
    out = {}
    for name, rs in sorted(by.items()):
        gaps = [token_gaps(r)[0] for r in rs]
        out[name] = {
            "requests": len(rs),
            "ttft": percentile([r.ttft for r in rs if r.ttft is not None], pct),
            "itl": percentile(np.concatenate(gaps) if gaps else [], pct),
        }
    return out


def max_in_flight(records: list[RequestRecord]) -> int:
    events: dict[str, list[tuple[float, int]]] = {}
    for r in records:
        if r.ok and r.end_time is not None:
            ev = events.setdefault(r.replica or "", [])
            ev.append((r.send_time, 1))
            ev.append((r.end_time, -1))
    best = 0
    for ev in events.values():
        ev.sort(key=lambda e: (e[0], e[1]))  # ends before starts at equal times
        now = 0
        for _, d in ev:
            now += d
            best = max(best, now)
    return best


def judge(
    ttft: float | None,
    itl: float | None,
    slo: SLOTarget,
    summary: Summary,
    cls: str | None = None,
) -> tuple[bool, str]:
    """(met, the check in words) of ``_scoped``'s figures (of class ``cls``: its limits)."""
    p = f"P{slo.percentile:g}"
    where = "" if cls is None else f"class {cls}: "
    if summary.num_ok == 0 or ttft is None:
        return False, f"{where}no request finished inside the window"
    lt, li = slo.limits_of(cls)
    parts, ok = [], True
    if lt is not None:
        good = ttft <= lt
        ok &= good
        parts.append(f"TTFT {p} {ttft:.2f} s {'<=' if good else '>'} {lt:g} s")
    if li is not None:
        good = itl is not None and itl <= li
        ok &= good
        shown = "-" if itl is None else f"{itl * 1e3:.0f} ms"
        parts.append(f"ITL {p} {shown} {'<=' if good else '>'} {li * 1e3:g} ms")
    if cls is not None and len(slo.classes or ()) > 1:
        where = f"class {cls} (the furthest of {', '.join(sorted(slo.classes or ()))}): "
    return ok, where + ", ".join(parts)


@dataclass(frozen=True, slots=True)
class PointSpec:
    """What to simulate for one (candidate, rate): the seed and timing, and whether the point
    is judged for sustainability (``long``) with an early stop (``stop_waiting``)."""

    rate: float
    seed: int
    duration: float
    warmup: float
    long: bool = False
    stop_waiting: int | None = None
    burst_period: float | None = None
    """Seconds between bursts at this rate (the tail of a long point is whole periods)."""


def _sustained(p: PointResult, spec: PointSpec, slo: SLOTarget, ok: bool, why: str):
    """The sustainability criterion (``sustain``) on top of the SLO check of a long point."""
    w = p.summary.window
    fin = sustain.finished_share(p.records, w)
    tr = sustain.trend(p.records, w)
    tail = sustain.tail_window(w, spec.burst_period)
    t_ttft, t_itl, _, t_cls = _scoped(
        p.summary, [r for r in p.records if tail.start <= r.send_time < tail.end], slo, tail
    )
    t_ok, t_why = judge(t_ttft, t_itl, slo, p.summary, t_cls)
    parts = [why]
    if not t_ok:
        parts.append(f"end of the window ({tail.length:.0f} s): {t_why}")
    if fin < sustain.MIN_FINISHED_SHARE:
        parts.append(
            f"finished {fin:.1%} of the requests sent (< {sustain.MIN_FINISHED_SHARE:.0%})"
        )
    if tr.rising:
        parts.append(tr.describe())
    good = ok and t_ok and fin >= sustain.MIN_FINISHED_SHARE and not tr.rising
    return good, "; ".join(parts), fin, tr


def _stopped_why(t: float, bound: int | None) -> str:
    return (
        f"stopped at {t:.0f} s: more than {bound} requests waited for their first token at "
        "once (the queue runs away)"
    )


def reduce_point(p: PointResult, spec: PointSpec, slo: SLOTarget, wall: float) -> Outcome:
    ttft, itl, miss, cls = _scoped(p.summary, p.records, slo)
    ok, why = judge(ttft, itl, slo, p.summary, cls)
    fin, tr = 1.0, None
    if p.stopped_at is not None:
        ok, why, miss = False, _stopped_why(p.stopped_at, spec.stop_waiting), 1.0
    elif spec.long:
        ok, why, fin, tr = _sustained(p, spec, slo, ok, why)
    return Outcome(
        rate=spec.rate,
        duration=spec.duration,
        warmup=spec.warmup,
        summary=p.summary,
        ttft=ttft,
        itl=itl,
        ok=ok,
        why=why,
        miss_share=miss if ttft is not None else 1.0,
        peak_kv_usage=p.peak_kv_usage,
        prefix_hit_rate=p.prefix_hit_rate,
        max_in_flight=max_in_flight(p.records),
        per_class=_per_class(p.records, p.summary.window, slo.percentile),
        wall=wall,
        seed=spec.seed,
        long=spec.long,
        finished_share=fin,
        trend=tr,
        stopped_at=p.stopped_at,
        slo_class=cls,
    )


def evaluate(cand: Candidate, workload: WorkloadSpec, spec: PointSpec, slo: SLOTarget) -> Outcome:
    t0, c0 = time.perf_counter(), time.process_time()
    p = simulate_point(
        cand.deployment,
        workload,
        Load(rate=spec.rate),
        duration=spec.duration,
        warmup=spec.warmup,
        seed=spec.seed,
        policy=cand.policy,
        slo=slo.stats_slo(),
        class_slos=slo.class_slos(),
        stop_waiting=spec.stop_waiting,
        long_replicas=cand.long_replicas,
    )
    o = reduce_point(p, spec, slo, time.perf_counter() - t0)
    o.cpu = time.process_time() - c0
    return o


# ---- the rate search ----------------------------------------------------------------------------


FUTILE = 0.1
COARSE_STEP = 1.5
"""A search that may step down past ``max_down`` (``coarse_down``) does so by this factor."""


class RateSearch:
    """The highest rate whose SLO holds, one point at a time: ``propose()`` the next rate (None:
    done), ``record()`` its outcome. From ``start``, multiply (or divide) by ``grow`` until the
    SLO flips, then bisect geometrically while ``hi / lo > 1 + rel_tol``. ``max_down`` bounds
    the divisions (a flag variant worse than the best is not chased down; ``coarse_down``
    more divisions by ``COARSE_STEP`` may follow them), ``max_up`` the
    multiplications (a verification only steps down); ``prune(bound)``
    stops bisecting once the bracket lies below ``bound`` (it cannot win any more). Halving also
    stops when it no longer helps: when halving the rate cut the share of requests that miss
    the SLO by less than ``FUTILE`` of itself, the miss is not a matter of load (e.g. one burst
    alone breaks the SLO)."""

    def __init__(
        self,
        start: float,
        *,
        rel_tol: float,
        min_rate: float,
        max_rate: float,
        grow: float = 2.0,
        max_down: int | None = None,
        accelerate: bool = False,
        max_up: int | None = None,
        coarse_down: int = 0,
    ) -> None:
        self.start = nice(min(max(start, min_rate), max_rate))
        self.coarse_down = coarse_down
        self.rel_tol, self.min_rate, self.max_rate, self.grow = rel_tol, min_rate, max_rate, grow
        self.max_down = max_down
        self.max_up = max_up
        self.accelerate = accelerate
        self._ups = 0
        self.lo: float | None = None
        self.hi: float | None = None
        self.points: dict[float, Outcome] = {}
        self._downs = 0
        self._stopped = False
        self.futile = False
        """Halving stopped because lower rates did not get closer to the SLO."""

    def propose(self) -> float | None:
        if self._stopped:
            return None
        if not self.points:
            return self.start
        lo, hi = self.lo, self.hi
        if lo is None:
            step = self.grow
            if self.max_down is not None and self._downs >= self.max_down:
                if self._downs >= self.max_down + self.coarse_down:
                    return None
                step = COARSE_STEP  # far below the start: the start was far off, go faster
            r = nice(hi / step)
            self._downs += 1
            return r if r >= self.min_rate and r not in self.points else None
        if hi is None:
            if self.max_up is not None and self._ups >= self.max_up:
                return None
            step = self.grow ** (2**self._ups) if self.accelerate else self.grow
            self._ups += 1
            r = nice(lo * step)
            return r if r <= self.max_rate and r not in self.points else None
        if hi / lo <= 1 + self.rel_tol:
            return None
        mid = nice(math.sqrt(lo * hi))
        return mid if lo < mid < hi and mid not in self.points else None

    def record(self, o: Outcome) -> None:
        if self.max_down is None and self.lo is None and self.hi is not None and not o.ok:
            prev = self.points[self.hi]
            # a point stopped early (its queue ran away) is a matter of load: keep going down
            stopped = o.stopped_at is not None or prev.stopped_at is not None
            if not stopped and o.miss_share > (1 - FUTILE) * prev.miss_share:
                self.futile = self._stopped = True
        self.points[o.rate] = o
        if o.ok:
            self.lo = o.rate if self.lo is None else max(self.lo, o.rate)
        else:
            self.hi = o.rate if self.hi is None else min(self.hi, o.rate)

    def prune(self, bound: float) -> None:
        if self.lo is not None and self.hi is not None and self.hi <= bound:
            self._stopped = True


@dataclass(frozen=True, slots=True)
class Task:
    candidate: Candidate
    start: float
    grow: float = 2.0
    max_down: int | None = None
    accelerate: bool = False
    max_up: int | None = None
    coarse_down: int = 0

    def search(self, settings: SearchSettings, min_rate: float) -> RateSearch:
        return RateSearch(
            self.start,
            rel_tol=settings.rel_tol,
            min_rate=min_rate,
            max_rate=settings.max_rate,
            grow=self.grow,
            max_down=self.max_down,
            accelerate=self.accelerate,
            max_up=self.max_up,
            coarse_down=self.coarse_down,
        )


# ---- the frontier ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FrontierPoint:
    label: str
    rate: float
    output_throughput: float
    ttft: float
    itl: float
    slo_ok: bool

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}


def frontier(results: Sequence[CandidateResult]) -> list[FrontierPoint]:
    """The points that met the SLO and that no other such point beats on throughput, TTFT and
    ITL (at the SLO percentile) at once, ordered by throughput."""
    pts = [
        FrontierPoint(r.candidate.label, p.rate, p.summary.output_throughput, p.ttft, p.itl, p.ok)
        for r in results
        for p in r.points
        if p.ok and p.ttft is not None and p.itl is not None
    ]

    def beaten(a: FrontierPoint) -> bool:
        return any(
            b.output_throughput >= a.output_throughput
            and b.ttft <= a.ttft
            and b.itl <= a.itl
            and (b.output_throughput, -b.ttft, -b.itl) != (a.output_throughput, -a.ttft, -a.itl)
            for b in pts
        )

    return sorted((p for p in pts if not beaten(p)), key=lambda p: p.output_throughput)


# ---- where to start -------------------------------------------------------------------------------


def _typical_batch(dep: Deployment, profile: WorkloadProfile) -> tuple[int, int]:
    """(decode batch the KV cache holds at the mean length, mean context of a running request)."""
    mem = dep.memory()
    batch = max(1, min(dep.max_num_seqs, int(mem.max_concurrency(profile.mean_total))))
    return batch, int(profile.mean_prompt + profile.mean_output / 2)


def settle_time(dep: Deployment, profile: WorkloadProfile) -> float:
    """Seconds the 99th-percentile request takes by the cost model (its prompt chunked by the
    token budget, then its output at the decode step of a typical batch): after about this long
    the fleet holds a steady mix of requests at every stage."""
    cost = dep.cost_model()
    batch, context = _typical_batch(dep, profile)
    prompt = int(np.percentile(profile.prompts, 99))
    output = int(np.percentile(profile.outputs, 99))
    prefill = cost.prefill_time(prompt, dep.max_num_batched_tokens)
    return prefill + output * cost.decode_step_time(batch, context)


def choose_warmup(dep: Deployment, profile: WorkloadProfile, settings: SearchSettings) -> float:
    """The settle time, rounded up to 5 s, within [min_warmup, max_warmup]. With bursts, the
    least: the window then spans whole burst periods, and the burst the run starts with plays
    the previous period's (its tail inside the window stands for the next burst's tail after
    it), so no longer warm-up is needed to measure a steady period."""
    if settings.warmup is not None:
        return settings.warmup
    if profile.burst is not None and profile.burst.period:
        return settings.min_warmup
    t = math.ceil(settle_time(dep, profile) / 5) * 5
    return float(min(max(t, settings.min_warmup), settings.max_warmup))


def burst_limited_rate(dep: Deployment, profile: WorkloadProfile, slo: SLOTarget) -> float | None:
    """With bursts, the rate at which a burst's backlog would hold up only the share of
    requests the TTFT percentile allows: each replica prefills its share of a burst (cost
    model), requests arriving meanwhile wait; the period must be long enough that the time
    spent beyond the TTFT SLO is at most ``1 - percentile`` of it."""
    b = profile.burst
    if b is None or not b.period or not profile.nominal_rate or slo.ttft is None:
        return None
    cost = dep.cost_model()
    mean_prompt = max(1, int(np.mean(b.new_tokens)))
    drain = cost.prefill_time(mean_prompt, dep.max_num_batched_tokens) * b.size / dep.replicas
    blocked = drain - slo.ttft
    if blocked <= 0:
        return None
    return b.period * profile.nominal_rate * (1 - slo.percentile / 100) / blocked


def estimate_rate(dep: Deployment, profile: WorkloadProfile) -> float:
    """A rough fleet capacity (requests/s) from the cost model, only to start the search near
    the answer: per replica, a request costs its prefill (chunked by the token budget) plus its
    output at the decode step time of the batch the KV cache holds."""
    cost = dep.cost_model()
    batch, context = _typical_batch(dep, profile)
    new = (
        int(profile.new_tokens().mean()) if dep.enable_prefix_caching else int(profile.mean_prompt)
    )
    prefill = cost.prefill_time(max(1, new), dep.max_num_batched_tokens)
    decode = profile.mean_output * cost.decode_step_time(batch, context) / batch
    return dep.replicas / (prefill + decode)
