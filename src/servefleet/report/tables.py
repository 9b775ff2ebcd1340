"""Every table of a run's report as plain data (pure): title, header, rows of text, the rows to
highlight. The terminal, Markdown and HTML renderers draw the same ``TableData``.

Counts (ok/sent, failed) cover every request of a point, warm-up and cool-down included;
latency percentiles cover the requests sent inside its window (docs/metrics.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from servefleet.report.figures import extras, judged, knee_of, reprefill_cell
from servefleet.report.run import PointData, RunData
from servefleet.stats import SLO, Distribution, Summary, slo_failures

WINDOW_NOTE = (
    "ok/sent and failed: every request of the point (warm-up and cool-down included); "
    "latencies: requests sent inside the window; times in ms"
)


SELFCHECK_HEAD = [
    "load",
    "offered req/s",
    "achieved req/s",
    "send lag p50/p99",
    "loop lag p99/max",
    "client CPU",
    "CPU wait",
    "verdict",
]
SERVER_HEAD = [
    "load",
    "client TTFT p50/p95",
    "server TTFT p50/p95",
    "queue mean",
    "prefill mean",
    "decode mean",
    "preemptions",
    "lookup hit",
    "peak KV",
    "re-prefill",
]
GPU_HEAD = [
    "load",
    "GPU",
    "replicas",
    "source",
    "utilization mean / max",
    "memory used max",
    "power mean / max",
    "SM clock mean",
]


@dataclass(slots=True)
class TableData:
    key: str
    title: str
    head: list[str]
    rows: list[list[str]] = field(default_factory=list)
    marks: list[str] = field(default_factory=list)
    """Per row: "" or a class — ``knee``, ``failed``, ``bound`` (client-bound)."""
    caption: str = ""


def ms(v: float | None) -> str:
    if v is None:
        return "-"
    v *= 1000
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:,.1f}" if abs(v) >= 1 else f"{v:.2f}"


def trio(d: Distribution) -> str:
    return "/".join(ms(getattr(d, a)) for a in ("p50", "p95", "p99"))


def pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


def latency_row(s: Summary) -> list[str]:
    return [
        f"{s.num_ok}/{s.num_requests}",
        str(s.num_failed) if s.num_failed else "0",
        f"{s.request_throughput:,.2f}",
        f"{s.output_throughput:,.0f}",
        trio(s.ttft),
        trio(s.itl),
        ms(s.tpot.mean),
        "-" if s.e2e_latency.p50 is None else f"{s.e2e_latency.p50:,.2f} s",
        f"{s.goodput:,.2f}",
    ]


LATENCY_HEAD = [
    "ok/sent",
    "failed",
    "req/s",
    "out tok/s",
    "TTFT p50/p95/p99",
    "ITL p50/p95/p99",
    "TPOT",
    "E2E p50",
    "goodput",
]


def _slo_cell(
    s: Summary, slo: SLO, max_error_rate: float, classes: dict[str, SLO] | None = None
) -> str:
    why = slo_failures(s, slo, max_error_rate, classes)
    return "met" if not why else "missed: " + "; ".join(why)


def sweep_table(run: RunData) -> TableData:
    pts = run.sorted_points()
    knee = knee_of(run)
    ex = [extras(run, p) for p in pts]
    keys = list(ex[0]) if ex else []
    t = TableData("summary", run.title, ["load", *LATENCY_HEAD, *keys, "SLOs"])
    for p, e in zip(pts, ex, strict=True):
        s = run.summary(p)
        failed = run.failed(p)
        label = p.label + (" ◀ knee" if p is knee else "") + (" FAILED" if failed else "")
        t.rows.append(
            [
                label,
                *latency_row(s),
                *[e[k] for k in keys],
                _slo_cell(s, run.slo, run.max_error_rate, run.slo_classes),
            ]
        )
        t.marks.append("failed" if failed else "knee" if p is knee else "")
    t.caption = WINDOW_NOTE + "; goodput: req/s that met their SLOs"
    return t


def group_tables(run: RunData) -> list[TableData]:
    """One table per workload class (under its own SLOs), then one per session turn."""
    pts = run.sorted_points()
    out = []
    for attr, kind in (("by_class", "class"), ("by_turn", "session")):
        names = list(dict.fromkeys(n for p in pts for n in getattr(run.summary(p), attr)))
        for name in names:
            slo = run.class_slos.get(name, run.slo) if attr == "by_class" else run.slo
            title = f"{kind} {name}" if attr == "by_class" else f"sessions, {name}"
            t = TableData(f"{attr}:{name}", title, ["load", *LATENCY_HEAD, "SLOs"])
            for p in pts:
                s = getattr(run.summary(p), attr).get(name)
                if s is None:
                    continue
                t.rows.append([p.label, *latency_row(s), _slo_cell(s, slo, run.max_error_rate)])
                t.marks.append("failed" if s.failed_point(run.max_error_rate) else "")
            t.caption = (
                f"SLOs of this class: TTFT ≤ {slo.ttft} s, TPOT ≤ {slo.itl} s"
                if attr == "by_class"
                else "turn k of every session (goodput judged by each request's class SLOs)"
            )
            out.append(t)
    return out


def errors_table(run: RunData) -> TableData | None:
    t = TableData(
        "errors", "errors (every request of each point)", ["load", "kind", "count", "example"]
    )
    for p in run.sorted_points():
        s = run.summary(p)
        for kind, n in sorted(s.error_kinds.items()):
            eg = next(
                (r.error for r in p.records if not r.ok and r.error and _kind_of(r) == kind), ""
            )
            t.rows.append([p.label, kind, str(n), eg or ""])
            t.marks.append("")
        if s.num_cancelled:
            t.rows.append([p.label, "cancelled by the client (Ctrl-C)", str(s.num_cancelled), ""])
            t.marks.append("")
    return t if t.rows else None


def _kind_of(r) -> str:
    from servefleet.stats import error_kind

    return error_kind(r)


def selfcheck_table(run: RunData) -> TableData | None:
    t = TableData(
        "selfcheck",
        "client self-checks",
        SELFCHECK_HEAD,
    )
    for p in run.sorted_points():
        c = judged(run, p)
        if c is None:
            continue
        t.rows.append(
            [
                p.label,
                f"{c.offered_rate:,.2f}",
                f"{c.achieved_rate:,.2f}",
                f"{ms(c.send_lag_p50)} / {ms(c.send_lag_p99)}",
                f"{ms(c.loop_lag_p99)} / {ms(c.loop_lag_max)}",
                f"{c.client_cpu:.0%}",
                pct(c.runqueue_wait),
                "CLIENT BOTTLENECK" if c.client_bound else "ok",
            ]
        )
        t.marks.append("bound" if c.client_bound else "")
    t.caption = (
        "times in ms; a client delay counts as a bottleneck only when it is over 10 % of the "
        "latency it distorts (stats.py judge)"
    )
    return t if t.rows else None


def client_warnings(run: RunData) -> tuple[list[str], list[str]]:
    """(warnings that make points client-bound, notes that do not matter), by point."""
    warns, notes = [], []
    for p in run.sorted_points():
        c = judged(run, p)
        if c is None:
            continue
        warns += [f"{p.label}: {w}" for w in c.warnings]
        notes += [f"{p.label}: {n}" for n in c.notes]
    return warns, notes


def server_table(run: RunData) -> TableData | None:
    t = TableData(
        "server",
        "server /metrics (server-side, beside the client's)",
        SERVER_HEAD,
    )
    for p in run.sorted_points():
        srv = p.raw.get("server")
        if not srv:
            continue
        h = srv.get("histograms") or {}

        def hv(k: str, a: str, h=h) -> str:
            return ms((h.get(k) or {}).get(a))

        s = run.summary(p)
        t.rows.append(
            [
                p.label,
                f"{ms(s.ttft.p50)} / {ms(s.ttft.p95)}",
                f"{hv('ttft', 'p50')} / {hv('ttft', 'p95')}",
                hv("queue", "mean"),
                hv("prefill", "mean"),
                hv("decode", "mean"),
                "-" if srv.get("preemptions") is None else f"{srv['preemptions']:,.0f}",
                pct(srv.get("prefix_hit_rate")),
                pct(srv.get("peak_kv_usage")),
                reprefill_cell(srv),
            ]
        )
        t.marks.append("")
    t.caption = (
        "times in ms; server percentiles interpolated inside histogram buckets; lookup hit: "
        "vLLM's prefix_cache_hits ÷ prefix_cache_queries, counted at every scheduling attempt "
        "(lower than the prefix hit of the requests when they queue); re-prefill: 0 when "
        "nothing was preempted, else n/a — vLLM counts no recomputed token — with the largest "
        "ratio the preemptions allow (docs/metrics.md)"
    )
    return t if t.rows else None


GPU_ROWS_PER_POINT = 16
"""Beyond this many GPUs in a point, the GPU table shows them folded (``_folded_gpu_rows``)."""


def gpu_table(run: RunData) -> TableData | None:
    t = TableData(
        "gpu",
        "GPUs during each point",
        GPU_HEAD,
    )
    folded = False
    for p in run.sorted_points():
        tel = gpu_series_of(run, p)
        if not tel:
            continue
        gpus = tel.get("gpus") or {}
        items = list((tel.get("figures") or {}).items())
        kind = tel.get("kind", "measured")
        if len(items) > GPU_ROWS_PER_POINT:
            folded = True
            rows = _folded_gpu_rows(items, gpus)
        else:
            rows = [(_gpu_name(gpus.get(key, {})), fig) for key, fig in items]
        for (gpu, replica), fig in rows:
            t.rows.append([p.label, gpu, replica, kind, *_gpu_cells(fig)])
            t.marks.append("")
    t.caption = (
        "measured: NVML (DCGM exporter names) sampled every 0.5 s; modelled: the share of "
        "wall time an engine step ran (sim-server or simulator)"
    )
    if folded:
        t.caption += (
            f"; a point with more than {GPU_ROWS_PER_POINT} GPUs shows all of them in one row "
            "(means of their means, the largest of their maxima), then the least and the most "
            "busy one"
        )
    return t if t.rows else None


def _gpu_name(g: dict) -> tuple[str, str]:
    gpu = f"{g.get('gpu')} {g.get('name', '')}".strip() if g.get("gpu") else "-"
    return gpu, g.get("replica", "") or "-"


def _gpu_cells(fig: dict) -> list[str]:
    def f(name: str, unit: str, scale: float = 1.0) -> str:
        v = fig.get(name)
        return "-" if v is None else f"{v * scale:,.0f}{unit}"

    return [
        f"{f('utilization_mean', ' %')} / {f('utilization_max', ' %')}",
        f("memory_used_max", " GiB", 1 / 1024),
        f"{f('power_mean', ' W')} / {f('power_max', ' W')}",
        f("sm_clock_mean", " MHz"),
    ]


def _folded_gpu_rows(
    items: list[tuple[str, dict]], gpus: dict
) -> list[tuple[tuple[str, str], dict]]:
    """Many GPUs as three rows: all of them (mean of each ``*_mean``, largest of each
    ``*_max``), then the least and the most busy (by mean utilization)."""
    figs = [fig for _, fig in items]
    folded: dict[str, float] = {}
    for name in {k for fig in figs for k in fig}:
        values = [fig[name] for fig in figs if fig.get(name) is not None]
        if values:
            folded[name] = max(values) if name.endswith("_max") else sum(values) / len(values)
    busy = [
        (f["utilization_mean"], key, f) for key, f in items if f.get("utilization_mean") is not None
    ]
    rows = [((f"all {len(items)}", "-"), folded)]
    if busy:
        low = min(busy, key=lambda b: b[0])
        high = max(busy, key=lambda b: b[0])
        for label, (_, key, fig) in (("least busy", low), ("most busy", high)):
            gpu, replica = _gpu_name(gpus.get(key, {}))
            rows.append(((f"{label}: {gpu}" if gpu != "-" else label, replica), fig))
    return rows


def gpu_series_of(run: RunData, p: PointData) -> dict | None:
    """A point's GPU series: bench's ``telemetry``, or the simulator's ``gpu_busy``."""
    return p.raw.get("telemetry") or p.raw.get("gpu_busy")


def detail_tables(run: RunData) -> list[TableData]:
    """Errors, server metrics, GPU figures, self-checks (those that have rows)."""
    parts = [errors_table(run), server_table(run), gpu_table(run), selfcheck_table(run)]
    return [t for t in parts if t is not None]


def all_tables(run: RunData) -> list[TableData]:
    """Every table after the summary, in report order."""
    return [*group_tables(run), *detail_tables(run)]
