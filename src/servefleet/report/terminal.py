"""A run in the terminal: header, verdict, the sweep table, per-class and per-turn tables,
errors, server metrics, GPU telemetry, the client's self-checks (``report.tables``' data)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from servefleet.report.header import header_rows
from servefleet.report.run import RunData
from servefleet.report.tables import TableData, all_tables, client_warnings, sweep_table
from servefleet.report.verdict import verdict_lines

STYLES = {"knee": "bold yellow", "failed": "bold red", "bound": "red"}


def rich_table(t: TableData) -> Table:
    out = Table(title=t.title, title_justify="left", header_style="bold")
    for i, h in enumerate(t.head):
        out.add_column(h, justify="left" if i == 0 else "right")
    for row, mark in zip(t.rows, t.marks, strict=True):
        out.add_row(*row, style=STYLES.get(mark))
    out.caption = t.caption or None
    return out


def print_run(run: RunData, console: Console) -> None:
    pts = run.sorted_points()
    if not pts:
        console.print("(no points)")
        return
    for label, text in header_rows(run):
        console.print(f"[bold]{label}:[/] {text}", highlight=False)
    for line in verdict_lines(run):
        bad = line.startswith(("INCOMPLETE", "FAILED")) or " at no point" in line
        console.print(f"[bold red]{line}[/]" if bad else f"[bold]{line}[/]", highlight=False)
    console.print(rich_table(sweep_table(run)))
    for t in all_tables(run):
        console.print(rich_table(t))
    for p in pts:
        for n in p.raw.get("notes", []):
            console.print(f"[yellow]note ({p.label}):[/] {n}", highlight=False)
    warns, notes = client_warnings(run)
    if warns:
        console.print(
            "[bold white on red] WARNING: the client, not the server, was the bottleneck at "
            "some points; their latencies include client delays [/]"
        )
        for w in warns:
            console.print(f"  [red]{w}[/]", highlight=False)
    for n in notes:
        console.print(f"[dim]client note (too small to matter here): {n}[/]", highlight=False)
    if run.kind == "bench":
        sizes = [(p.label, p.raw.get("prompt_tokens") or {}) for p in pts]
        sizes = [(label, d) for label, d in sizes if d.get("target_mean") is not None]
        if sizes:
            console.print(
                "prompt tokens, target → server's count (mean): "
                + ", ".join(
                    f"{label} {d['target_mean']:,.0f} → {d['actual_mean'] or 0:,.0f}"
                    for label, d in sizes
                ),
                highlight=False,
            )
