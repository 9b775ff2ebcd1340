"""A self-contained HTML report: one file, inline CSS and SVG plots, no network.

Plots: throughput vs load, TTFT and ITL percentiles vs load with the knee marked, latency CDFs
(TTFT, ITL, E2E) per point, and time series of requests in flight and output token rate. A few
lines of script collect any JavaScript error into the page (``#sf-check``) and count the plots
that rendered, so a headless browser can check the report (see tests/test_report_html.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from html import escape

from servefleet.report.figures import FIGURES, extras, knee_of
from servefleet.report.knee import KneeRule
from servefleet.report.run import PointData, RunData
from servefleet.report.series import cdf, e2e_values, in_flight, itl_values, token_rate, ttft_values
from servefleet.report.svg import CSS as SVG_CSS
from servefleet.report.svg import Series, line_chart

CHECK_JS = """
window.__sfErrors = [];
window.addEventListener('error', function (e) { window.__sfErrors.push(String(e.message || e)); });
(function () {
  var orig = console.error;
  console.error = function () {
    window.__sfErrors.push(Array.prototype.join.call(arguments, ' '));
    return orig.apply(console, arguments);
  };
})();
window.addEventListener('load', function () {
  var ok = 0, bad = [];
  document.querySelectorAll('svg.plot').forEach(function (s) {
    var b = s.getBoundingClientRect();
    if (b.width > 0 && b.height > 0 && s.querySelectorAll('path.series').length > 0) { ok++; }
    else { bad.push(s.getAttribute('data-plot')); }
  });
  var el = document.getElementById('sf-check');
  el.setAttribute('data-plots-ok', String(ok));
  el.setAttribute('data-plots-bad', bad.join(','));
  el.setAttribute('data-errors', JSON.stringify(window.__sfErrors));
  el.textContent = ok + ' plots rendered' + (bad.length ? ', empty: ' + bad.join(', ') : '') +
    (window.__sfErrors.length ? '; script errors: ' + window.__sfErrors.join(' | ') : '');
});
"""

PAGE_CSS = """
body { font: 14px/1.45 -apple-system, 'Segoe UI', Roboto, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 8px 0; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
th { background: #f4f4f4; } td:first-child, th:first-child { text-align: left; }
tr.knee td { background: #fff6d5; font-weight: bold; }
.grid { display: flex; flex-wrap: wrap; gap: 12px; }
.warn { background: #c62828; color: #fff; padding: 6px 10px; font-weight: bold; }
.muted { color: #666; } code { background: #f4f4f4; padding: 0 3px; }
#sf-check { color: #999; font-size: 11px; }
"""


def _table(
    head: Sequence[str], rows: Sequence[Sequence[str]], row_class: Sequence[str] = ()
) -> str:
    h = "".join(f"<th>{escape(c)}</th>" for c in head)
    body = []
    for i, r in enumerate(rows):
        cls = f' class="{row_class[i]}"' if i < len(row_class) and row_class[i] else ""
        body.append(f"<tr{cls}>" + "".join(f"<td>{escape(str(c))}</td>" for c in r) + "</tr>")
    return f"<table><thead><tr>{h}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _log_axis(values: Sequence[float]) -> bool:
    v = [x for x in values if x > 0]
    return len(v) > 1 and max(v) / min(v) >= 8


def load_charts(run: RunData, knee: PointData | None) -> list[str]:
    pts = run.sorted_points()
    xs = [p.value for p in pts]
    s = [run.summary(p) for p in pts]
    axis = "concurrency" if run.axis == "concurrency" else "request rate (req/s)"
    log_x = _log_axis(xs)
    kx = knee.value if knee is not None else None
    ms = 1000.0

    def lat(attr: str) -> list[Series]:
        return [
            Series(
                f"P{q}",
                xs,
                [None if (v := getattr(getattr(x, attr), f"p{q}")) is None else v * ms for x in s],
            )
            for q in (50, 90, 95, 99)
        ]

    return [
        line_chart(
            f"Output throughput vs {run.axis}",
            [
                Series("output tok/s", xs, [x.output_throughput for x in s]),
                Series("total tok/s", xs, [x.total_throughput for x in s], dashed=True),
            ],
            x_label=axis,
            y_label="tokens/s",
            log_x=log_x,
            marker_x=kx,
            plot_id="throughput",
        ),
        line_chart(
            f"Requests/s and goodput vs {run.axis}",
            [
                Series("requests/s", xs, [x.request_throughput for x in s]),
                Series("goodput (SLOs met)", xs, [x.goodput for x in s], dashed=True),
            ],
            x_label=axis,
            y_label="requests/s",
            log_x=log_x,
            marker_x=kx,
            plot_id="requests",
        ),
        line_chart(
            f"TTFT percentiles vs {run.axis}",
            lat("ttft"),
            x_label=axis,
            y_label="TTFT (ms)",
            log_x=log_x,
            marker_x=kx,
            plot_id="ttft",
        ),
        line_chart(
            f"ITL percentiles vs {run.axis}",
            lat("itl"),
            x_label=axis,
            y_label="ITL (ms)",
            log_x=log_x,
            marker_x=kx,
            plot_id="itl",
        ),
    ]


def distribution_charts(run: RunData) -> list[str]:
    pts = run.sorted_points()
    out = []
    for pid, title, get in (
        ("cdf-ttft", "TTFT CDF", ttft_values),
        ("cdf-itl", "ITL CDF (per token)", itl_values),
        ("cdf-e2e", "E2E latency CDF", e2e_values),
    ):
        series = []
        allv: list[float] = []
        for p in pts:
            v = [x * 1000 for x in get(p.records)]
            allv += v[:1000]
            xs, ys = cdf(v)
            series.append(Series(p.label, xs, ys, markers=False))
        out.append(
            line_chart(
                title,
                series,
                x_label="ms",
                y_label="fraction of requests" if pid != "cdf-itl" else "fraction of tokens",
                log_x=_log_axis(allv) and min(allv, default=0) > 0,
                plot_id=pid,
            )
        )
    return out


def time_charts(run: RunData) -> list[str]:
    pts = run.sorted_points()
    infl, rate = [], []
    for p in pts:
        t0 = p.window.start if run.kind == "simulate" else 0.0
        xs, ys = in_flight(p.records)
        infl.append(Series(p.label, [x - t0 for x in xs], ys, markers=False))
        xs, ys = token_rate(p.records)
        rate.append(Series(p.label, [x - t0 for x in xs], ys, markers=False))
    return [
        line_chart(
            "Requests in flight over time",
            infl,
            x_label="seconds since the point's start",
            y_label="requests",
            plot_id="inflight",
        ),
        line_chart(
            "Output token rate over time",
            rate,
            x_label="seconds since the point's start",
            y_label="tokens/s",
            plot_id="tokenrate",
        ),
    ]


def summary_table(run: RunData, knee: PointData | None) -> str:
    pts = run.sorted_points()
    ex = [extras(run, p) for p in pts]
    keys = list(ex[0]) if ex else []
    head = [
        "load",
        "requests",
        *[f.name + (" (ms)" if f.unit == "ms" else "") for f in FIGURES],
        *keys,
    ]
    rows, cls = [], []
    for p, e in zip(pts, ex, strict=True):
        s = run.summary(p)
        rows.append(
            [
                p.label + (" ◀ knee" if p is knee else ""),
                f"{s.num_ok}/{s.num_requests}",
                *[f.fmt(f.get(s)) for f in FIGURES],
                *[e[k] for k in keys],
            ]
        )
        cls.append("knee" if p is knee else "")
    return _table(head, rows, cls)


def selfcheck_section(run: RunData) -> str:
    rows, warn = [], []
    for p in run.sorted_points():
        c = p.raw.get("selfcheck")
        if not c:
            continue

        def ms(v):
            return "-" if v is None else f"{v * 1000:,.2f}"

        rows.append(
            [
                p.label,
                f"{c['offered_rate']:,.2f}",
                f"{c['achieved_rate']:,.2f}",
                f"{ms(c.get('send_lag_p50'))} / {ms(c.get('send_lag_p99'))}",
                f"{ms(c.get('loop_lag_p99'))} / {ms(c.get('loop_lag_max'))}",
                f"{c['client_cpu']:.0%}",
                "-" if c.get("runqueue_wait") is None else f"{c['runqueue_wait']:.1%}",
                "CLIENT BOTTLENECK" if c.get("client_bound") else "ok",
            ]
        )
        warn += [f"{p.label}: {w}" for w in c.get("warnings", [])]
    if not rows:
        return ""
    html = "<h2>Client self-checks</h2>" + _table(
        [
            "load",
            "offered req/s",
            "achieved req/s",
            "send lag p50 / p99 (ms)",
            "loop lag p99 / max (ms)",
            "client CPU",
            "CPU wait",
            "verdict",
        ],
        rows,
    )
    if warn:
        html += (
            '<p class="warn">The client, not the server, was the bottleneck at some points: '
            "their latencies include client delays.</p><ul>"
            + "".join(f"<li>{escape(w)}</li>" for w in warn)
            + "</ul>"
        )
    return html


def server_section(run: RunData) -> str:
    rows = []
    for p in run.sorted_points():
        s = p.raw.get("server")
        if not s:
            continue
        h = s.get("histograms") or {}

        def hv(k, a, h=h):
            v = (h.get(k) or {}).get(a)
            return "-" if v is None else f"{v * 1000:,.1f}"

        summ = run.summary(p)
        rows.append(
            [
                p.label,
                "-" if summ.ttft.p95 is None else f"{summ.ttft.p95 * 1000:,.1f}",
                hv("ttft", "p95"),
                hv("queue", "mean"),
                hv("prefill", "mean"),
                hv("decode", "mean"),
                hv("e2e", "p50"),
                "-" if s.get("preemptions") is None else f"{s['preemptions']:,.0f}",
                "-" if s.get("prefix_hit_rate") is None else f"{s['prefix_hit_rate']:.1%}",
                "-" if s.get("peak_kv_usage") is None else f"{s['peak_kv_usage']:.1%}",
                "-" if s.get("reprefill_estimate") is None else f"{s['reprefill_estimate']:.1%}",
            ]
        )
    if not rows:
        return ""
    return (
        "<h2>Server metrics (/metrics, beside the client's)</h2>"
        + _table(
            [
                "load",
                "client TTFT p95",
                "server TTFT p95",
                "queue mean",
                "prefill mean",
                "decode mean",
                "server E2E p50",
                "preemptions",
                "prefix hit",
                "peak KV",
                "re-prefill (est.)",
            ],
            rows,
        )
        + '<p class="muted">times in ms; server percentiles are interpolated inside histogram buckets</p>'
    )


def errors_section(run: RunData) -> str:
    rows = []
    for p in run.sorted_points():
        s = run.summary(p)
        for k, n in sorted(s.error_kinds.items()):
            eg = next((r.error for r in p.records if not r.ok and r.error), "")
            rows.append([p.label, k, str(n), eg or ""])
    return ("<h2>Errors</h2>" + _table(["load", "kind", "count", "example"], rows)) if rows else ""


def render_html(run: RunData, title: str | None = None) -> str:
    knee = knee_of(run)
    title = title or run.title
    rule = KneeRule().describe()
    meta = run.meta
    settings = meta.get("settings", {})
    knee_text = (
        f"Knee at <b>{escape(knee.label)}</b>: {escape(rule)}."
        if knee
        else f"No knee in this sweep ({escape(rule)})."
    )
    search = meta.get("search")
    search_html = ""
    if search:
        best = search.get("highest_rate_held")
        search_html = (
            "<p><b>SLO search:</b> highest rate whose SLOs held: "
            + (f"{best:g} req/s" if best is not None else "none")
            + "</p>"
        )
    parts = [
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
        f"<title>{escape(title)}</title>",
        f"<script>{CHECK_JS}</script>",
        f"<style>{PAGE_CSS}{SVG_CSS}</style></head><body>",
        f"<h1>{escape(title)}</h1>",
        f'<p class="muted">{escape(run.kind)} run <code>{escape(str(run.path or run.name))}</code>; '
        f"SLOs: TTFT ≤ {run.slo.ttft} s, TPOT ≤ {run.slo.itl} s; settings: "
        f"<code>{escape(json.dumps(settings, default=str))}</code></p>",
        f"<p>{knee_text}</p>{search_html}",
        "<h2>Summary</h2>",
        summary_table(run, knee),
        '<p class="muted">latencies over requests sent inside each point\'s measurement window '
        "(warm-up and cool-down left out); definitions in docs/metrics.md</p>",
        "<h2>Throughput and latency vs load</h2>",
        '<div class="grid">',
        *load_charts(run, knee),
        "</div>",
        "<h2>Latency distributions</h2>",
        '<div class="grid">',
        *distribution_charts(run),
        "</div>",
        "<h2>Over time</h2>",
        '<div class="grid">',
        *time_charts(run),
        "</div>",
        selfcheck_section(run),
        server_section(run),
        errors_section(run),
        '<p id="sf-check" data-plots-ok="" data-errors=""></p>',
        "</body></html>",
    ]
    return "\n".join(parts)
