"""Two runs side by side, point by point, with ratios (B ÷ A).

Points are lined up by their load (the same concurrency, or the same rate); either run may be
simulated or measured, so a prediction (``servefleet simulate``) can be held against a
measurement (``servefleet bench``) of the same workload spec.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from html import escape

from rich.console import Console
from rich.table import Table

from servefleet.report.figures import BY_KEY, FIGURES, Figure
from servefleet.report.html import CHECK_JS, PAGE_CSS, _table
from servefleet.report.markdown import md_table
from servefleet.report.run import PointData, RunData
from servefleet.report.svg import CSS as SVG_CSS
from servefleet.report.svg import Series, line_chart

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


@dataclass(slots=True)
class Pair:
    label: str
    value: float
    a: PointData | None
    b: PointData | None


def pair_points(a: RunData, b: RunData) -> list[Pair]:
    if a.points and b.points and a.axis != b.axis:
        raise ValueError(
            f"cannot line up a {a.axis} sweep ({a.name}) with a {b.axis} sweep ({b.name}): "
            "compare runs of the same kind of load"
        )
    pa = {p.key: p for p in a.points}
    pb = {p.key: p for p in b.points}
    keys = sorted(set(pa) | set(pb), key=lambda k: k[1])
    return [Pair((pa.get(k) or pb[k]).label, k[1], pa.get(k), pb.get(k)) for k in keys]


def ratio(va: float | None, vb: float | None) -> float | None:
    if va is None or vb is None or va == 0:
        return None
    return vb / va


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


def compare_data(a: RunData, b: RunData, figures: list[Figure]) -> list[dict]:
    rows = []
    for pair in pair_points(a, b):
        row: dict = {"label": pair.label, "load": pair.value, "matched": bool(pair.a and pair.b)}
        sa = pair.a.summary(a.slo) if pair.a else None
        sb = pair.b.summary(b.slo) if pair.b else None
        for f in figures:
            va = f.get(sa) if sa else None
            vb = f.get(sb) if sb else None
            row[f.key] = {"a": va, "b": vb, "ratio": ratio(va, vb)}
        rows.append(row)
    return rows


def _cell(f: Figure, c: dict) -> str:
    r = c["ratio"]
    return f"{f.fmt(c['a'])} | {f.fmt(c['b'])} | " + ("-" if r is None else f"×{r:.2f}")


def print_compare(a: RunData, b: RunData, console: Console, figures: list[Figure]) -> None:
    rows = compare_data(a, b, figures)
    console.print(f"[bold]A[/] = {a.title}  ({a.path})")
    console.print(f"[bold]B[/] = {b.title}  ({b.path})")
    t = Table(title="A | B | B÷A", title_justify="left", header_style="bold")
    t.add_column("load")
    for f in figures:
        t.add_column(f.name + (" ms" if f.unit == "ms" else ""), justify="right")
    for row in rows:
        label = row["label"] + ("" if row["matched"] else " (one run only)")
        t.add_row(label, *[_cell(f, row[f.key]) for f in figures])
    console.print(t)
    unmatched = [r["label"] for r in rows if not r["matched"]]
    if unmatched:
        console.print(f"[yellow]points in one run only:[/] {', '.join(unmatched)}")


def compare_markdown(a: RunData, b: RunData, figures: list[Figure]) -> str:
    rows = compare_data(a, b, figures)
    head = ["load", *[f"{f.name} (A / B / B÷A)" for f in figures]]
    body = [
        [r["label"], *[_cell(f, r[f.key]).replace(" | ", " / ") for f in figures]] for r in rows
    ]
    return f"# Compare\n\nA: {a.title}\n\nB: {b.title}\n\n{md_table(head, body)}\n"


def compare_json(a: RunData, b: RunData, figures: list[Figure]) -> str:
    return json.dumps(
        {
            "a": {"title": a.title, "path": str(a.path)},
            "b": {"title": b.title, "path": str(b.path)},
            "points": compare_data(a, b, figures),
        },
        indent=2,
    )


def compare_html(a: RunData, b: RunData, figures: list[Figure]) -> str:
    rows = compare_data(a, b, figures)
    matched = [r for r in rows if r["matched"]]
    xs = [r["load"] for r in matched]
    charts = []
    for f in figures:
        scale = 1000.0 if f.unit == "ms" else 1.0
        va = [None if r[f.key]["a"] is None else r[f.key]["a"] * scale for r in matched]
        vb = [None if r[f.key]["b"] is None else r[f.key]["b"] * scale for r in matched]
        log_x = len(xs) > 1 and min(xs) > 0 and max(xs) / min(xs) >= 8
        charts.append(
            line_chart(
                f"{f.name}: A vs B",
                [Series(f"A {a.name}", xs, va), Series(f"B {b.name}", xs, vb, dashed=True)],
                x_label=a.axis,
                y_label=f"{f.name} ({f.unit})",
                log_x=log_x,
                plot_id=f"cmp-{f.key}",
                width=460,
                height=280,
            )
        )
    head = ["load", *[f"{f.name} A / B / B÷A" for f in figures]]
    body = [
        [r["label"], *[_cell(f, r[f.key]).replace(" | ", " / ") for f in figures]] for r in rows
    ]
    return "\n".join(
        [
            '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>compare</title>',
            f"<script>{CHECK_JS}</script><style>{PAGE_CSS}{SVG_CSS}</style></head><body>",
            f"<h1>Compare</h1><p><b>A</b>: {escape(a.title)}<br><b>B</b>: {escape(b.title)}</p>",
            _table(head, body),
            '<div class="grid">',
            *charts,
            "</div>",
            '<p id="sf-check"></p></body></html>',
        ]
    )
