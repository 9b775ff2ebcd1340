"""Line charts as inline SVG, generated in Python: no plotting library, no script, no CDN.

``line_chart`` draws series of (x, y) points with axes, ticks (linear or log), a legend,
optional point markers with hover titles, and an optional vertical marker (the knee).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

PALETTE = (
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
    "#7f7f7f", "#bcbd22",
)  # fmt: skip


@dataclass(slots=True)
class Series:
    name: str
    xs: Sequence[float]
    ys: Sequence[float | None]
    dashed: bool = False
    markers: bool = True
    step: bool = False


def _nice_linear(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks, t = [], start
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 12))
        t += step
    return ticks


def _log_ticks(lo: float, hi: float) -> list[float]:
    out = []
    for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1):
        for m in (1, 2, 5):
            v = m * 10.0**e
            if lo * 0.999 <= v <= hi * 1.001:
                out.append(v)
    if len(out) > 8:
        out = [v for v in out if str(v).lstrip("0.").startswith("1")]
    if len(out) < 3:  # less than a decade: evenly spaced values read better than bare ends
        out = [v for v in _nice_linear(lo, hi, 4) if lo * 0.999 <= v <= hi * 1.001]
    return out or [lo, hi]


def fmt(v: float) -> str:
    a = abs(v)
    if a == 0:
        return "0"
    if a >= 1e6:
        return f"{v / 1e6:g}M"
    if a >= 1e4:
        return f"{v / 1e3:g}k"
    if a >= 100:
        return f"{v:,.0f}"
    if a >= 1:
        return f"{v:.3g}"
    return f"{v:.2g}"


def line_chart(
    title: str,
    series: Sequence[Series],
    *,
    x_label: str,
    y_label: str,
    log_x: bool = False,
    log_y: bool = False,
    marker_x: float | None = None,
    marker_label: str = "knee",
    plot_id: str = "",
    width: int = 620,
    height: int = 330,
) -> str:
    ml, mr, mt, mb = 64, 16, 34, 46
    pw, ph = width - ml - mr, height - mt - mb
    legend = legend_layout([s.name for s in series], pw)
    legend_h = 18 * (max((row for _, row in legend), default=-1) + 1)
    h_total = height + legend_h
    pts = [
        (x, y)
        for s in series
        for x, y in zip(s.xs, s.ys, strict=False)
        if y is not None
        and math.isfinite(y)
        and math.isfinite(x)
        and (not log_x or x > 0)
        and (not log_y or y > 0)
    ]
    if not pts:
        return _empty(title, plot_id, width, h_total)
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    x0, x1 = min(xs), max(xs)
    y0, y1 = (min(ys), max(ys)) if log_y else (min(0.0, min(ys)), max(ys))
    if x1 == x0:
        x0, x1 = (x0 / 2, x1 * 2) if log_x else (x0 - 1, x1 + 1)
    if y1 == y0:
        y0, y1 = (y0 / 2, y1 * 2) if log_y else (y0, y0 + 1)
    xt = _log_ticks(x0, x1) if log_x else _nice_linear(x0, x1)
    yt = _log_ticks(y0, y1) if log_y else _nice_linear(y0, y1)
    if not log_x:
        x0, x1 = min(x0, xt[0]), max(x1, xt[-1])
    if not log_y:
        y0, y1 = min(y0, yt[0]), max(y1, yt[-1])

    def X(x: float) -> float:
        f = (
            (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            if log_x
            else (x - x0) / (x1 - x0)
        )
        return ml + f * pw

    def Y(y: float) -> float:
        f = (
            (math.log(y) - math.log(y0)) / (math.log(y1) - math.log(y0))
            if log_y
            else (y - y0) / (y1 - y0)
        )
        return mt + ph - f * ph

    o = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="plot" data-plot="{escape(plot_id)}" '
        f'width="{width}" height="{h_total}" viewBox="0 0 {width} {h_total}" role="img">',
        f"<title>{escape(title)}</title>",
        f'<rect x="0" y="0" width="{width}" height="{h_total}" fill="#fff"/>',
        f'<text x="{width / 2}" y="20" text-anchor="middle" class="t">{escape(title)}</text>',
    ]
    for t in yt:
        if y0 <= t <= y1:
            y = Y(t)
            o.append(f'<line x1="{ml}" x2="{ml + pw}" y1="{y:.1f}" y2="{y:.1f}" class="g"/>')
            o.append(
                f'<text x="{ml - 6}" y="{y + 4:.1f}" text-anchor="end" class="k">{fmt(t)}</text>'
            )
    for t in xt:
        if x0 <= t <= x1:
            x = X(t)
            o.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{mt}" y2="{mt + ph}" class="g"/>')
            o.append(
                f'<text x="{x:.1f}" y="{mt + ph + 16}" text-anchor="middle" class="k">{fmt(t)}</text>'
            )
    o.append(f'<rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" class="frame"/>')
    o.append(
        f'<text x="{ml + pw / 2}" y="{mt + ph + 36}" text-anchor="middle" class="a">{escape(x_label)}</text>'
    )
    o.append(
        f'<text x="14" y="{mt + ph / 2}" text-anchor="middle" class="a" '
        f'transform="rotate(-90 14 {mt + ph / 2})">{escape(y_label)}</text>'
    )
    if marker_x is not None and x0 <= marker_x <= x1 and (not log_x or marker_x > 0):
        mx = X(marker_x)
        o.append(
            f'<line x1="{mx:.1f}" x2="{mx:.1f}" y1="{mt}" y2="{mt + ph}" class="knee" data-knee="1"/>'
        )
        o.append(f'<text x="{mx + 4:.1f}" y="{mt + 12}" class="kl">{escape(marker_label)}</text>')
    for i, s in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        seg = [
            (X(x), Y(y))
            for x, y in zip(s.xs, s.ys, strict=False)
            if y is not None and math.isfinite(y) and (not log_x or x > 0) and (not log_y or y > 0)
        ]
        if not seg:
            continue
        if s.step:
            d = [f"M{seg[0][0]:.1f},{seg[0][1]:.1f}"]
            for (_xa, ya), (xb, yb) in itertools.pairwise(seg):
                d.append(f"L{xb:.1f},{ya:.1f}L{xb:.1f},{yb:.1f}")
            path = "".join(d)
        else:
            path = "M" + "L".join(f"{x:.1f},{y:.1f}" for x, y in seg)
        dash = ' stroke-dasharray="6 4"' if s.dashed else ""
        o.append(
            f'<path d="{path}" fill="none" stroke="{color}" stroke-width="2"{dash} class="series"/>'
        )
        if s.markers and len(seg) <= 60:
            for (px, py), x, y in zip(seg, s.xs, s.ys, strict=False):
                o.append(
                    f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3" fill="{color}">'
                    f"<title>{escape(s.name)}: {fmt(x)} → {fmt(y or 0)}</title></circle>"
                )
    for i, s in enumerate(series):
        lx = ml + legend[i][0]
        ly = height + 4 + 18 * legend[i][1]
        color = PALETTE[i % len(PALETTE)]
        dash = ' stroke-dasharray="6 4"' if s.dashed else ""
        o.append(
            f'<line x1="{lx:.1f}" x2="{lx + 22:.1f}" y1="{ly:.1f}" y2="{ly:.1f}" stroke="{color}" stroke-width="2"{dash}/>'
        )
        o.append(f'<text x="{lx + 28:.1f}" y="{ly + 4:.1f}" class="k">{escape(s.name)}</text>')
    o.append("</svg>")
    return "\n".join(o)


LEGEND_CHAR_PX = 6.6
"""Width of a legend character at 11 px sans-serif (a generous estimate: no overlap)."""


def legend_layout(names: Sequence[str], width: float) -> list[tuple[float, int]]:
    """(x offset, row) of each legend entry: entries flow left to right, each as wide as its
    swatch and text, and wrap to a new row rather than overlap."""
    out, x, row = [], 0.0, 0
    for name in names:
        w = 28 + LEGEND_CHAR_PX * len(name) + 14
        if x > 0 and x + w > width:
            x, row = 0.0, row + 1
        out.append((x, row))
        x += w
    return out


def _empty(title: str, plot_id: str, width: int, height: int) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="plot empty" data-plot="{escape(plot_id)}" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}">'
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#fff"/>'
        f'<text x="{width / 2}" y="20" text-anchor="middle" class="t">{escape(title)}</text>'
        f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" class="k">no data</text></svg>'
    )


CSS = """
svg.plot text.t { font: bold 14px sans-serif; fill: #222; }
svg.plot text.k { font: 11px sans-serif; fill: #444; }
svg.plot text.a { font: 12px sans-serif; fill: #222; }
svg.plot text.kl { font: bold 11px sans-serif; fill: #b8860b; }
svg.plot line.g { stroke: #e5e5e5; stroke-width: 1; }
svg.plot rect.frame { fill: none; stroke: #999; stroke-width: 1; }
svg.plot line.knee { stroke: #b8860b; stroke-width: 2; stroke-dasharray: 4 3; }
"""
