"""Terminal tables of summaries (pure: records in, rich renderables out)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table

from servefleet.stats import Distribution, Summary


def _ms(d: Distribution, attr: str) -> str:
    v = getattr(d, attr)
    return "-" if v is None else f"{v * 1000:,.0f}" if v >= 1 else f"{v * 1000:,.1f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


def _trio(d: Distribution) -> str:
    return "/".join(_ms(d, a) for a in ("p50", "p95", "p99"))


def sweep_table(
    title: str,
    labels: Sequence[str],
    summaries: Sequence[Summary],
    extras: Sequence[dict[str, str]] | None = None,
    knee: int | None = None,
) -> Table:
    t = Table(title=title, title_justify="left", header_style="bold")
    cols = [
        "load",
        "req/s",
        "out tok/s",
        "TTFT p50/95/99",
        "ITL p50/95/99",
        "TPOT",
        "E2E p50",
        "goodput",
    ]
    extra_keys = list(extras[0]) if extras else []
    for i, name in enumerate(cols + extra_keys):
        t.add_column(name, justify="left" if i == 0 else "right")
    for i, (label, s) in enumerate(zip(labels, summaries, strict=True)):
        row = [
            label + (" ◀ knee" if knee == i else ""),
            f"{s.request_throughput:,.2f}",
            f"{s.output_throughput:,.0f}",
            _trio(s.ttft),
            _trio(s.itl),
            _ms(s.tpot, "mean"),
            "-" if s.e2e_latency.p50 is None else f"{s.e2e_latency.p50:,.1f}s",
            f"{s.goodput:,.2f}",
        ]
        row += [extras[i][k] for k in extra_keys] if extras else []
        t.add_row(*row, style="bold yellow" if knee == i else None)
    t.caption = "TTFT, ITL, TPOT (mean) in ms; goodput: req/s meeting the SLOs"
    return t


def percent(v: float | None) -> str:
    return _pct(v)
