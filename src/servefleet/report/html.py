"""A self-contained HTML report: one file, inline CSS and SVG plots, no network.

Top down: the header (deployment, flags, workload), the verdict (SLOs met up to which load, the
knee, headroom), the summary table (FAILED points in red), per-class and per-turn tables;
plots of throughput and latency vs load (knee marked), latency CDFs on log axes, and over time
requests in flight, output token rate and the GPUs (utilization, memory, power — measured, or
the simulator's modelled busy share); then errors, server metrics, GPU figures and the client's
self-checks, and the output-quality comparison when the folder holds one (``report.quality``). A few lines of script collect any JavaScript error into the page (``#sf-check``)
and count the plots that rendered, so a headless browser can check the report
(tests/test_report.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from servefleet.report.figures import knee_of
from servefleet.report.header import header_rows
from servefleet.report.quality import quality_tables
from servefleet.report.run import PointData, RunData
from servefleet.report.series import cdf, e2e_values, in_flight, itl_values, token_rate, ttft_values
from servefleet.report.svg import CSS as SVG_CSS
from servefleet.report.svg import Series, line_chart
from servefleet.report.tables import (
    TableData,
    client_warnings,
    detail_tables,
    gpu_series_of,
    group_tables,
    sweep_table,
)
from servefleet.report.verdict import verdict_lines

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
tr.failed td { background: #fde0e0; color: #a00; font-weight: bold; }
tr.bound td { color: #c62828; }
dl.head { display: grid; grid-template-columns: max-content auto; gap: 2px 14px; font-size: 13px; }
dl.head dt { font-weight: bold; color: #444; } dl.head dd { margin: 0; }
.verdict { border-left: 4px solid #1f77b4; background: #f5f9fd; padding: 6px 12px; }
.verdict p { margin: 3px 0; } .verdict p.bad { color: #a00; font-weight: bold; }
.verdict p.cls { margin-left: 18px; font-size: 13px; }
caption { caption-side: bottom; text-align: left; color: #666; font-size: 12px; }
.grid { display: flex; flex-wrap: wrap; gap: 12px; }
.warn { background: #c62828; color: #fff; padding: 6px 10px; font-weight: bold; }
.muted { color: #666; } code { background: #f4f4f4; padding: 0 3px; }
#sf-check { color: #999; font-size: 11px; }
"""


def _table(
    head: Sequence[str],
    rows: Sequence[Sequence[str]],
    row_class: Sequence[str] = (),
    caption: str = "",
) -> str:
    h = "".join(f"<th>{escape(c)}</th>" for c in head)
    body = []
    for i, r in enumerate(rows):
        cls = f' class="{row_class[i]}"' if i < len(row_class) and row_class[i] else ""
        body.append(f"<tr{cls}>" + "".join(f"<td>{escape(str(c))}</td>" for c in r) + "</tr>")
    cap = f"<caption>{escape(caption)}</caption>" if caption else ""
    return f"<table>{cap}<thead><tr>{h}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def html_table(t: TableData, heading: str = "h3") -> str:
    """A ``TableData`` with its title as a heading."""
    return f"<{heading}>{escape(t.title)}</{heading}>" + _table(t.head, t.rows, t.marks, t.caption)


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
    """CDFs of TTFT, ITL (per token) and E2E, one line per point, on a log time axis (latencies
    span decades: a 5 ms token gap and a 15 s stall both stay readable)."""
    pts = run.sorted_points()
    out = []
    for pid, title, get in (
        ("cdf-ttft", "TTFT CDF", ttft_values),
        ("cdf-itl", "ITL CDF (per token)", itl_values),
        ("cdf-e2e", "E2E latency CDF", e2e_values),
    ):
        series = []
        for p in pts:
            v = [x * 1000 for x in get(window_records(p)) if x > 0]
            xs, ys = cdf(v)
            series.append(Series(p.label, xs, ys, markers=False))
        out.append(
            line_chart(
                title + " (log scale)",
                series,
                x_label="ms (log scale)",
                y_label="fraction of requests" if pid != "cdf-itl" else "fraction of tokens",
                log_x=True,
                plot_id=pid,
            )
        )
    return out


def window_records(p: PointData) -> list:
    """The records whose latencies the summary measures: sent inside the point's window."""
    w = p.window
    return [r for r in p.records if w.start <= r.send_time < w.end]


def time_charts(run: RunData) -> list[str]:
    """Over time, one line per point: requests in flight, output token rate, and the GPUs
    (utilization or modelled busy share, memory used, power) on the same time axis."""
    pts = run.sorted_points()
    infl, rate = [], []
    gpu: dict[str, list[Series]] = {"utilization": [], "memory_used": [], "power": []}
    kinds = set()
    t0 = 0.0  # both worlds' times are seconds since the point's start
    for p in pts:
        xs, ys = in_flight(p.records)
        infl.append(Series(p.label, [x - t0 for x in xs], ys, markers=False))
        xs, ys = token_rate(p.records)
        rate.append(Series(p.label, [x - t0 for x in xs], ys, markers=False))
        tel = gpu_series_of(run, p)
        if not tel:
            continue
        kinds.add(tel.get("kind", "measured"))
        t = [x - t0 for x in tel.get("t", [])]
        for name, cols in (tel.get("values") or {}).items():
            if name not in gpu:
                continue
            for key, col in cols.items():
                g = (tel.get("gpus") or {}).get(key, {})
                who = f"GPU {g['gpu']}" if g.get("gpu") else (g.get("replica") or key)
                scale = 1 / 1024 if name == "memory_used" else 1.0
                ys = [None if v is None else v * scale for v in col]
                gpu[name].append(Series(f"{p.label} {who}", t, ys, markers=False))
    x_label = "seconds since the point's start"
    charts = [
        line_chart(
            "Requests in flight over time",
            infl,
            x_label=x_label,
            y_label="requests",
            plot_id="inflight",
        ),
        line_chart(
            "Output token rate over time",
            rate,
            x_label=x_label,
            y_label="tokens/s",
            plot_id="tokenrate",
        ),
    ]
    modelled = kinds == {"modelled"}
    for name, title, unit in (
        (
            "utilization",
            "GPU busy share over time (modelled)" if modelled else "GPU utilization over time",
            "%",
        ),
        ("memory_used", "GPU memory used over time", "GiB"),
        ("power", "GPU power over time", "W"),
    ):
        if gpu[name]:
            charts.append(
                line_chart(title, gpu[name], x_label=x_label, y_label=unit, plot_id=f"gpu-{name}")
            )
    return charts


def header_html(run: RunData) -> str:
    rows = "".join(
        f"<dt>{escape(label)}</dt><dd>{escape(text)}</dd>" for label, text in header_rows(run)
    )
    return f'<dl class="head">{rows}</dl>'


def verdict_html(run: RunData) -> str:
    out = []
    for line in verdict_lines(run):
        bad = line.startswith(("INCOMPLETE", "FAILED")) or " at no point" in line
        cls = "bad" if bad else "cls" if line.startswith("  ") else ""
        out.append(f'<p class="{cls}">{escape(line.strip())}</p>')
    return '<div class="verdict" id="verdict">' + "".join(out) + "</div>"


def warnings_html(run: RunData) -> str:
    warns, notes = client_warnings(run)
    html = ""
    if warns:
        html += (
            '<p class="warn">The client, not the server, was the bottleneck at some points: '
            "their latencies include client delays.</p><ul>"
            + "".join(f"<li>{escape(w)}</li>" for w in warns)
            + "</ul>"
        )
    if notes:
        html += (
            '<p class="muted">Client readings over their limits but too small, next to the '
            'latencies, to matter:</p><ul class="muted">'
            + "".join(f"<li>{escape(n)}</li>" for n in notes)
            + "</ul>"
        )
    return html


def quality_html(data: dict) -> str:
    """The output-quality section (``servefleet quality``'s quality.json)."""
    return '<h2 id="quality">Output quality</h2>' + "".join(
        html_table(t) for t in quality_tables(data)
    )


def render_quality_page(data: dict) -> str:
    """A report of a quality comparison alone."""
    title = f"Output quality: {data['candidate']['model']} against {data['reference']['model']}"
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{PAGE_CSS}</style></head><body>"
        f"<h1>{escape(title)}</h1>{quality_html(data)}</body></html>"
    )


def render_html(run: RunData, title: str | None = None, quality: dict | None = None) -> str:
    knee = knee_of(run)
    title = title or run.title
    notes = [f"{p.label}: {n}" for p in run.sorted_points() for n in p.raw.get("notes", [])]
    parts = [
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
        f"<title>{escape(title)}</title>",
        f"<script>{CHECK_JS}</script>",
        f"<style>{PAGE_CSS}{SVG_CSS}</style></head><body>",
        f"<h1>{escape(title)}</h1>",
        header_html(run),
        "<h2>Verdict</h2>",
        verdict_html(run),
        '<h2 id="summary">Summary</h2>',
        html_table(sweep_table(run), "h3"),
        *[html_table(t) for t in group_tables(run)],
        "<h2>Throughput and latency vs load</h2>",
        '<div class="grid">',
        *load_charts(run, knee),
        "</div>",
        "<h2>Latency distributions</h2>",
        '<div class="grid">',
        *distribution_charts(run),
        "</div>",
        '<h2 id="over-time">Over time</h2>',
        '<div class="grid">',
        *time_charts(run),
        "</div>",
        '<h2 id="details">Details</h2>',
        *[html_table(t) for t in detail_tables(run)],
        warnings_html(run),
        quality_html(quality) if quality is not None else "",
        (
            "<h3>Notes</h3><ul>" + "".join(f"<li>{escape(n)}</li>" for n in notes) + "</ul>"
            if notes
            else ""
        ),
        '<p id="sf-check" data-plots-ok="" data-errors=""></p>',
        "</body></html>",
    ]
    return "\n".join(parts)
