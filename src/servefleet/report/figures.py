"""The figures a report shows per point, computed from records (pure), shared by every format."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from servefleet.prefix_hit import prefix_hit
from servefleet.report.run import PointData, RunData
from servefleet.stats import KneeRule, SelfCheck, Summary, find_knee, judge


@dataclass(frozen=True, slots=True)
class Figure:
    key: str
    name: str
    unit: str
    get: Callable[[Summary], float | None]
    higher_is_better: bool = False

    def fmt(self, v: float | None) -> str:
        if v is None:
            return "-"
        if self.unit == "ms":
            v = v * 1000
            return f"{v:,.0f}" if abs(v) >= 100 else f"{v:,.1f}" if abs(v) >= 1 else f"{v:.3f}"
        if self.unit == "%":
            return f"{v:.1%}"
        return f"{v:,.0f}" if abs(v) >= 100 else f"{v:,.2f}"


FIGURES: tuple[Figure, ...] = (
    Figure("request_throughput", "req/s", "req/s", lambda s: s.request_throughput, True),
    Figure("output_throughput", "out tok/s", "tok/s", lambda s: s.output_throughput, True),
    Figure("total_throughput", "total tok/s", "tok/s", lambda s: s.total_throughput, True),
    Figure("goodput", "goodput", "req/s", lambda s: s.goodput, True),
    Figure("ttft_p50", "TTFT p50", "ms", lambda s: s.ttft.p50),
    Figure("ttft_p95", "TTFT p95", "ms", lambda s: s.ttft.p95),
    Figure("ttft_p99", "TTFT p99", "ms", lambda s: s.ttft.p99),
    Figure("itl_p50", "ITL p50", "ms", lambda s: s.itl.p50),
    Figure("itl_p95", "ITL p95", "ms", lambda s: s.itl.p95),
    Figure("itl_p99", "ITL p99", "ms", lambda s: s.itl.p99),
    Figure("tpot_mean", "TPOT mean", "ms", lambda s: s.tpot.mean),
    Figure("e2e_p50", "E2E p50", "ms", lambda s: s.e2e_latency.p50),
    Figure("e2e_p99", "E2E p99", "ms", lambda s: s.e2e_latency.p99),
)
BY_KEY = {f.key: f for f in FIGURES}


def knee_of(run: RunData, rule: KneeRule | None = None) -> PointData | None:
    pts = run.sorted_points()
    if len(pts) < 2 or run.meta.get("search"):
        return None
    s = [run.summary(p) for p in pts]
    i = find_knee(
        [p.value for p in pts], [x.output_throughput for x in s], [x.ttft.p95 for x in s], rule
    )
    return None if i is None else pts[i]


def pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


def reprefill_cell(srv: dict) -> str:
    """Re-prefill as /metrics allow: a derived figure, or "n/a" with its bound — never a 0
    that was not derived."""
    if srv.get("reprefill") is not None:
        return pct(srv["reprefill"])
    if srv.get("reprefill_max") is not None:
        return f"n/a (≤ {srv['reprefill_max']:.1%})"
    return "n/a"


def judged(run: RunData, p: PointData):
    """The point's client self-check (``SelfCheck``), judged against its recomputed latencies
    (``stats.judge``); None for a simulated run."""
    raw = p.raw.get("selfcheck")
    if not raw:
        return None
    s = run.summary(p)
    return judge(SelfCheck.from_dict(raw), s.ttft.p50, s.itl.p50)


def extras(run: RunData, p: PointData) -> dict[str, str]:
    """Per-point columns beyond the summary: the server's view and the client's verdict
    (bench), or the simulator's cache figures and modelled GPU busy share."""
    s = run.summary(p)
    if run.kind == "simulate":
        busy = (p.raw.get("gpu_busy") or {}).get("figures") or {}
        means = [
            f["utilization_mean"] for f in busy.values() if f.get("utilization_mean") is not None
        ]
        return {
            "re-prefill": pct(s.recomputed_ratio),
            "prefix hit": pct(p.raw.get("prefix_hit_rate")),
            "peak KV": pct(p.raw.get("peak_kv_usage")),
            "GPU busy": f"{sum(means) / len(means):.0f} %" if means else "-",
        }
    srv = p.raw.get("server") or {}
    hist = srv.get("histograms") or {}
    sttft = (hist.get("ttft") or {}).get("p95")
    check = judged(run, p)
    bound = check is not None and check.client_bound
    return {
        "srv TTFT p95": "-" if sttft is None else f"{sttft * 1000:,.0f}",
        "prefix hit": pct(prefix_hit(p.records, p.raw.get("server")).rate),
        "peak KV": pct(srv.get("peak_kv_usage")),
        "preempt": "-" if srv.get("preemptions") is None else f"{srv['preemptions']:,.0f}",
        "re-prefill": reprefill_cell(srv) if srv else "-",
        "client": "BOTTLENECK" if bound else "ok",
    }
