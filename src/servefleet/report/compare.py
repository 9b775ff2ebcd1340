"""Two runs side by side over *all* their points, with B ÷ A and a one-line verdict per figure.

Rule: the loads are the union of both runs' points (the same kind of load: concurrency, or
rate). Where a run has no point at a load inside its own range, its value there is
interpolated linearly in log(load) between its two neighbouring points (sweeps are geometric),
and marked ``~``; outside its range it has none (never extrapolated). A figure's verdict is the
median of B ÷ A over the loads where both have a value, with its range: within ±10 % the runs
*agree*; else B is higher or lower by that much. Each workload class both runs have gets the
same, for its main figures.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from html import escape

import numpy as np
from rich.console import Console
from rich.table import Table

from servefleet.report.figures import BY_KEY, FIGURES, Figure
from servefleet.report.fit import Fitted
from servefleet.report.html import CHECK_JS, PAGE_CSS, _table
from servefleet.report.markdown import md_table
from servefleet.report.run import PointData, RunData
from servefleet.report.svg import CSS as SVG_CSS
from servefleet.report.svg import Series, line_chart
from servefleet.stats import Summary

DEFAULT_FIGURES = (
    "request_throughput",
    "output_throughput",
    "ttft_p50",
    "ttft_p95",
    "itl_p50",
    "itl_p95",
    "tpot_mean",
    "e2e_p50",
    "goodput",
)
CLASS_FIGURES = ("ttft_p95", "itl_p95", "goodput")
AGREE = 0.10
"""Median B ÷ A within 1 ± this: the runs agree on the figure."""

Getter = Callable[[PointData], Summary | None]


@dataclass(slots=True)
class Cell:
    a: float | None
    b: float | None
    a_exact: bool
    b_exact: bool

    @property
    def ratio(self) -> float | None:
        return ratio(self.a, self.b)


@dataclass(slots=True)
class Row:
    label: str
    load: float
    in_a: bool
    in_b: bool
    cells: dict[str, Cell]


def ratio(va: float | None, vb: float | None) -> float | None:
    if va is None or vb is None or va == 0:
        return None
    return vb / va


def check_axes(a: RunData, b: RunData) -> None:
    if a.points and b.points and a.axis != b.axis:
        raise ValueError(
            f"cannot line up a {a.axis} sweep ({a.name}) with a {b.axis} sweep ({b.name}): "
            "compare runs of the same kind of load"
        )


def interpolate(xs: list[float], vs: list[float | None], x: float) -> tuple[float | None, bool]:
    """(value at ``x``, exact?): a point's own value, else linear in log(load) between the
    neighbouring points that have one; None outside their range."""
    known = [(xi, v) for xi, v in zip(xs, vs, strict=True) if v is not None]
    for xi, v in known:
        if xi == x:
            return v, True
    lo = [(xi, v) for xi, v in known if xi < x]
    hi = [(xi, v) for xi, v in known if xi > x]
    if not lo or not hi:
        return None, False
    (x0, v0), (x1, v1) = lo[-1], hi[0]
    if x0 > 0 and x > 0:
        f = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
    else:
        f = (x - x0) / (x1 - x0)
    return v0 + f * (v1 - v0), False


def align(
    a: RunData, b: RunData, figures: list[Figure], get_a: Getter | None = None, get_b=None
) -> list[Row]:
    """Every load of either run, each figure of both there (exact or interpolated)."""
    check_axes(a, b)
    get_a = get_a or a.summary
    get_b = get_b or b.summary
    pa, pb = a.sorted_points(), b.sorted_points()
    sa = [get_a(p) for p in pa]
    sb = [get_b(p) for p in pb]
    labels = {p.value: p.label for p in [*pb, *pa]}
    loads = sorted(labels)
    rows = []
    xa, xb = [p.value for p in pa], [p.value for p in pb]
    for x in loads:
        cells = {}
        for f in figures:
            va, ea = interpolate(xa, [f.get(s) if s else None for s in sa], x)
            vb, eb = interpolate(xb, [f.get(s) if s else None for s in sb], x)
            cells[f.key] = Cell(va, vb, ea, eb)
        rows.append(Row(labels[x], x, x in xa, x in xb, cells))
    return rows


def metric_verdict(f: Figure, rows: list[Row]) -> str:
    rs = [r.cells[f.key].ratio for r in rows]
    rs = [x for x in rs if x is not None and x > 0]
    if not rs:
        return f"{f.name}: no load where both runs have a value"
    med = float(np.median(rs))
    span = f"×{min(rs):.2f}–×{max(rs):.2f}" if len(rs) > 1 else f"×{rs[0]:.2f}"
    over = f"median B÷A ×{med:.2f} over {len(rs)} load(s), {span}"
    if abs(med - 1) <= AGREE:
        return f"{f.name}: A and B agree within {abs(med - 1):.0%} ({over})"
    better = (med > 1) == f.higher_is_better
    judgement = "better" if better else "worse"
    if 0.5 <= med <= 2:
        how = f"{abs(med - 1):.0%} {'higher' if med > 1 else 'lower'} than A"
    else:
        how = f"×{med:.3g} A"
    return f"{f.name}: B is {how} — {judgement} ({over})"


def verdicts(rows: list[Row], figures: list[Figure]) -> list[str]:
    return [metric_verdict(f, rows) for f in figures]


def figures_of(keys: str | None) -> list[Figure]:
    if not keys:
        return [BY_KEY[k] for k in DEFAULT_FIGURES]
    out = []
    for k in keys.split(","):
        k = k.strip()
        if k not in BY_KEY:
            raise ValueError(
                f"unknown figure {k!r}; use some of: {', '.join(f.key for f in FIGURES)}"
            )
        out.append(BY_KEY[k])
    return out


def shared_classes(a: RunData, b: RunData) -> list[str]:
    def names(run: RunData) -> list[str]:
        return list(dict.fromkeys(n for p in run.points for n in run.summary(p).by_class))

    nb = set(names(b))
    return [n for n in names(a) if n in nb]


def class_rows(a: RunData, b: RunData, name: str, figures: list[Figure]) -> list[Row]:
    return align(
        a,
        b,
        figures,
        lambda p: a.summary(p).by_class.get(name),
        lambda p: b.summary(p).by_class.get(name),
    )


def _v(f: Figure, v: float | None, exact: bool) -> str:
    return f.fmt(v) if v is None or exact else "~" + f.fmt(v)


def cell_text(f: Figure, c: Cell, sep: str = " | ") -> str:
    r = c.ratio
    return sep.join(
        [_v(f, c.a, c.a_exact), _v(f, c.b, c.b_exact), "-" if r is None else f"×{r:.2f}"]
    )


def _label(r: Row) -> str:
    return r.label + ("" if r.in_a and r.in_b else " (A only)" if r.in_a else " (B only)")


def warnings(a: RunData, b: RunData) -> list[str]:
    """What makes the two runs' latencies differ besides the server: the client protocol (per-
    chunk usage costs vLLM's API server work on every token; chat and completions differ)."""
    pa, pb = a.client_protocol, b.client_protocol
    if pa is not None and pb is not None and pa != pb:
        return [
            f"the runs used different client protocols (A: {pa}; B: {pb}): the server's "
            "per-token work differs, and so do its latencies"
        ]
    return []


NOTE = (
    "A | B | B÷A; ~: interpolated between the run's neighbouring points (linear in log load); "
    "- : outside that run's range"
)


def print_compare(a: RunData, b: RunData, console: Console, figures: list[Figure]) -> None:
    rows = align(a, b, figures)
    console.print(f"[bold]A[/] = {a.title}  ({a.path})", highlight=False)
    console.print(f"[bold]B[/] = {b.title}  ({b.path})", highlight=False)
    for w in warnings(a, b):
        console.print(f"[bold yellow]warning:[/] {w}", highlight=False)
    for line in verdicts(rows, figures):
        console.print(f"  {line}", highlight=False)
    t = Table(title="A | B | B÷A", title_justify="left", header_style="bold", caption=NOTE)
    t.add_column("load")
    for f in figures:
        t.add_column(f.name + (" ms" if f.unit == "ms" else ""), justify="right")
    for r in rows:
        t.add_row(_label(r), *[cell_text(f, r.cells[f.key]) for f in figures])
    console.print(Fitted(t))
    cfigs = [BY_KEY[k] for k in CLASS_FIGURES]
    for name in shared_classes(a, b):
        crows = class_rows(a, b, name, cfigs)
        console.print(
            f"[bold]class {name}:[/] " + "; ".join(verdicts(crows, cfigs)), highlight=False
        )


def compare_markdown(a: RunData, b: RunData, figures: list[Figure]) -> str:
    rows = align(a, b, figures)
    head = ["load", *[f"{f.name} (A / B / B÷A)" for f in figures]]
    body = [[_label(r), *[cell_text(f, r.cells[f.key], " / ") for f in figures]] for r in rows]
    out = [f"# Compare\n\nA: {a.title}\n\nB: {b.title}\n"]
    out += [f"> **warning:** {w}\n" for w in warnings(a, b)]
    out += [f"- {line}" for line in verdicts(rows, figures)]
    out += ["", md_table(head, body), "", f"_{NOTE}_", ""]
    cfigs = [BY_KEY[k] for k in CLASS_FIGURES]
    for name in shared_classes(a, b):
        out.append(f"- class {name}: " + "; ".join(verdicts(class_rows(a, b, name, cfigs), cfigs)))
    return "\n".join(out).rstrip() + "\n"


def compare_json(a: RunData, b: RunData, figures: list[Figure]) -> str:
    rows = align(a, b, figures)

    def row(r: Row) -> dict:
        d: dict = {"label": r.label, "load": r.load, "in_a": r.in_a, "in_b": r.in_b}
        for k, c in r.cells.items():
            d[k] = {
                "a": c.a,
                "b": c.b,
                "a_exact": c.a_exact,
                "b_exact": c.b_exact,
                "ratio": c.ratio,
            }
        return d

    cfigs = [BY_KEY[k] for k in CLASS_FIGURES]
    return json.dumps(
        {
            "a": {"title": a.title, "path": str(a.path), "client_protocol": a.client_protocol},
            "b": {"title": b.title, "path": str(b.path), "client_protocol": b.client_protocol},
            "warnings": warnings(a, b),
            "verdicts": verdicts(rows, figures),
            "points": [row(r) for r in rows],
            "classes": {
                name: [row(r) for r in class_rows(a, b, name, cfigs)]
                for name in shared_classes(a, b)
            },
        },
        indent=2,
    )


def compare_html(a: RunData, b: RunData, figures: list[Figure]) -> str:
    rows = align(a, b, figures)
    charts = []
    pa, pb = a.sorted_points(), b.sorted_points()
    xs = [p.value for p in [*pa, *pb]]
    log_x = len(xs) > 1 and min(xs) > 0 and max(xs) / min(xs) >= 8
    for f in figures:
        scale = 1000.0 if f.unit == "ms" else 1.0

        def pts(run: RunData, ps: list[PointData], f=f, scale=scale) -> tuple[list, list]:
            vals = [f.get(run.summary(p)) for p in ps]
            return [p.value for p in ps], [None if v is None else v * scale for v in vals]

        (xa, va), (xb, vb) = pts(a, pa), pts(b, pb)
        ys = [v for v in (*va, *vb) if v is not None and v > 0]
        log_y = f.unit == "ms" and bool(ys) and max(ys) / min(ys) >= 30  # decades apart
        charts.append(
            line_chart(
                f"{f.name}: A vs B",
                [Series(f"A: {a.name}", xa, va), Series(f"B: {b.name}", xb, vb, dashed=True)],
                x_label=a.axis,
                y_label=f"{f.name} ({f.unit}{', log scale' if log_y else ''})",
                log_x=log_x,
                log_y=log_y,
                plot_id=f"cmp-{f.key}",
                width=460,
                height=280,
            )
        )
    head = ["load", *[f"{f.name} A / B / B÷A" for f in figures]]
    body = [[_label(r), *[cell_text(f, r.cells[f.key], " / ") for f in figures]] for r in rows]
    cfigs = [BY_KEY[k] for k in CLASS_FIGURES]
    classes = [
        f"<li><b>class {escape(n)}</b>: "
        + escape("; ".join(verdicts(class_rows(a, b, n, cfigs), cfigs)))
        + "</li>"
        for n in shared_classes(a, b)
    ]
    return "\n".join(
        [
            '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>compare</title>',
            f"<script>{CHECK_JS}</script><style>{PAGE_CSS}{SVG_CSS}</style></head><body>",
            f"<h1>Compare</h1><p><b>A</b>: {escape(a.title)}<br><b>B</b>: {escape(b.title)}</p>",
            *(f'<p class="warn"><b>warning:</b> {escape(w)}</p>' for w in warnings(a, b)),
            '<div class="verdict" id="verdict">'
            + "".join(f"<p>{escape(v)}</p>" for v in verdicts(rows, figures))
            + "</div>",
            f"<ul>{''.join(classes)}</ul>" if classes else "",
            _table(head, body, caption=NOTE),
            '<div class="grid">',
            *charts,
            "</div>",
            '<p id="sf-check"></p></body></html>',
        ]
    )
