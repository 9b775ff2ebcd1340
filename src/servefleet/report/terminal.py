"""A run in the terminal: the sweep table, the knee, self-checks, server metrics, warnings."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from servefleet.report.figures import extras, knee_of
from servefleet.report.knee import KneeRule
from servefleet.report.run import RunData
from servefleet.report.table import sweep_table


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:,.1f}"


def print_run(run: RunData, console: Console) -> None:
    pts = run.sorted_points()
    if not pts:
        console.print("(no points)")
        return
    knee = knee_of(run)
    summaries = [run.summary(p) for p in pts]
    console.print(
        sweep_table(
            run.title,
            [p.label for p in pts],
            summaries,
            [extras(run, p) for p in pts],
            pts.index(knee) if knee is not None else None,
        )
    )
    rule = KneeRule().describe()
    if knee is not None:
        console.print(f"knee at {knee.label}: {rule}")
    elif len(pts) > 1 and not run.meta.get("search"):
        console.print(f"no knee in this sweep ({rule})")
    search = run.meta.get("search")
    if search:
        best = search.get("highest_rate_held")
        console.print(
            "[bold]SLO search:[/] highest rate whose SLOs held: "
            + (f"{best:g} req/s" if best is not None else "none (even the lowest rate failed)")
            + f" (TTFT P95 <= {run.slo.ttft} s, ITL P95 <= {run.slo.itl} s, errors <= 1 %)"
        )
    for p, s in zip(pts, summaries, strict=True):
        if s.error_kinds:
            kinds = ", ".join(f"{k} x{n}" for k, n in sorted(s.error_kinds.items()))
            console.print(f"[red]errors at {p.label}:[/] {kinds}")
            first = next((r.error for r in p.records if not r.ok and r.error), None)
            if first:
                console.print(f"  e.g. {first}")
    for p in pts:
        for n in p.raw.get("notes", []):
            console.print(f"[yellow]note ({p.label}):[/] {n}")
    if run.kind == "bench":
        sizes = [(p.label, p.raw.get("prompt_tokens") or {}) for p in pts]
        sizes = [(label, d) for label, d in sizes if d.get("target_mean") is not None]
        if sizes:
            console.print(
                "prompt tokens, target → server's count (mean): "
                + ", ".join(
                    f"{label} {d['target_mean']:,.0f} → {d['actual_mean'] or 0:,.0f}"
                    for label, d in sizes
                )
            )
        print_selfchecks(run, console)
        print_server(run, console)


def print_selfchecks(run: RunData, console: Console) -> None:
    t = Table(title="client self-checks", title_justify="left", header_style="bold")
    for c in (
        "load",
        "offered req/s",
        "achieved req/s",
        "send lag p50/p99 ms",
        "loop lag p99/max ms",
        "client CPU",
        "CPU wait",
        "verdict",
    ):
        t.add_column(c, justify="right")
    warned = []
    for p in run.sorted_points():
        c = p.raw.get("selfcheck") or {}
        if not c:
            continue
        t.add_row(
            p.label,
            f"{c['offered_rate']:,.2f}",
            f"{c['achieved_rate']:,.2f}",
            f"{_ms(c.get('send_lag_p50'))}/{_ms(c.get('send_lag_p99'))}",
            f"{_ms(c.get('loop_lag_p99'))}/{_ms(c.get('loop_lag_max'))}",
            f"{c['client_cpu']:.0%}",
            "-" if c.get("runqueue_wait") is None else f"{c['runqueue_wait']:.1%}",
            "[bold red]CLIENT BOTTLENECK[/]" if c.get("client_bound") else "[green]ok[/]",
        )
        warned += [(p.label, w) for w in c.get("warnings", [])]
    console.print(t)
    if warned:
        console.print(
            "[bold white on red] WARNING: the client, not the server, was the bottleneck "
            "at some points; their latencies include client delays [/]"
        )
        for label, w in warned:
            console.print(f"  [red]{label}:[/] {w}")


def print_server(run: RunData, console: Console) -> None:
    rows = [(p, p.raw.get("server")) for p in run.sorted_points()]
    if not any(s for _, s in rows):
        return
    t = Table(
        title="server /metrics (server-side, beside the client's)",
        title_justify="left",
        header_style="bold",
    )
    cols = [
        "load",
        "client TTFT p50/p95",
        "server TTFT p50/p95",
        "queue mean",
        "prefill mean",
        "decode mean",
        "preemptions",
        "prefix hit",
        "peak KV",
        "re-prefill (est.)",
    ]
    for c in cols:
        t.add_column(c, justify="right")
    for p, s in rows:
        if not s:
            continue
        h = s.get("histograms") or {}
        summ = run.summary(p)

        def hp(k: str, a: str, h=h) -> str:
            return _ms((h.get(k) or {}).get(a))

        t.add_row(
            p.label,
            f"{_ms(summ.ttft.p50)}/{_ms(summ.ttft.p95)}",
            f"{hp('ttft', 'p50')}/{hp('ttft', 'p95')}",
            hp("queue", "mean"),
            hp("prefill", "mean"),
            hp("decode", "mean"),
            "-" if s.get("preemptions") is None else f"{s['preemptions']:,.0f}",
            "-" if s.get("prefix_hit_rate") is None else f"{s['prefix_hit_rate']:.1%}",
            "-" if s.get("peak_kv_usage") is None else f"{s['peak_kv_usage']:.1%}",
            "-" if s.get("reprefill_estimate") is None else f"{s['reprefill_estimate']:.1%}",
        )
    t.caption = "times in ms; server percentiles are interpolated inside histogram buckets"
    console.print(t)
