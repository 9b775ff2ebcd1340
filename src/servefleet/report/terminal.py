"""A run in the terminal: header, verdict, the sweep table, per-class and per-turn tables,
errors, server metrics, GPU telemetry, the client's self-checks (``report.tables``' data)."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table

from servefleet.report.fit import FIGURE_WIDTH, Fitted
from servefleet.report.header import header_rows
from servefleet.report.run import RunData
from servefleet.report.tables import TableData, all_tables, client_warnings, sweep_table
from servefleet.report.verdict import verdict_lines

STYLES = {"knee": "bold yellow", "failed": "bold red", "bound": "red"}


EMPTY_CELLS = frozenset({"", "-", "0", "0.0%", "n/a"})
"""Cells that say nothing happened: a column with only these is left out of a terminal table."""


def without_empty_columns(t: TableData) -> TableData:
    """The table without the columns (but the first) in which no row has anything to show,
    named in the caption, so that the rest fits a terminal. Markdown and HTML keep them all."""
    keep = [
        i
        for i in range(len(t.head))
        if i == 0 or not t.rows or any(r[i].strip() not in EMPTY_CELLS for r in t.rows)
    ]
    if len(keep) == len(t.head):
        return t
    gone = ", ".join(h for i, h in enumerate(t.head) if i not in keep)
    caption = "; ".join(c for c in (t.caption, f"left out, nothing to show: {gone}") if c)
    return TableData(
        t.key, t.title, [t.head[i] for i in keep], [[r[i] for i in keep] for r in t.rows],
        list(t.marks), caption,
    )  # fmt: skip


def with_misses_below(t: TableData) -> TableData:
    """SLO cells that say why a row missed shrink to "missed"; the reasons go under the table,
    one line a row (a terminal is too narrow for a sentence in a cell)."""
    if "SLOs" not in t.head:
        return t
    i = t.head.index("SLOs")
    rows, lines = [], []
    for r in t.rows:
        cell = r[i]
        if cell.startswith("missed: "):
            lines.append(f"{r[0].split(' ')[0]} missed: {cell.removeprefix('missed: ')}")
            r = [*r[:i], "missed", *r[i + 1 :]]
        rows.append(r)
    if not lines:
        return t
    caption = "\n".join(c for c in (t.caption, *lines) if c)
    return TableData(t.key, t.title, t.head, rows, list(t.marks), caption)


def with_short_knee_mark(t: TableData) -> TableData:
    """ "c=128 ◀ knee" becomes "c=128 ◀" (the caption says what ◀ marks)."""
    if not any(r and r[0].endswith(" ◀ knee") for r in t.rows):
        return t
    rows = [[r[0].replace(" ◀ knee", " ◀"), *r[1:]] for r in t.rows]
    caption = "; ".join(c for c in (t.caption, "◀ the knee") if c)
    return TableData(t.key, t.title, t.head, rows, list(t.marks), caption)


def natural_width(t: TableData) -> int:
    """Characters the table takes with every header and cell on one line."""
    widths = [max([len(h), *(len(r[i]) for r in t.rows)]) for i, h in enumerate(t.head)]
    return sum(widths) + 2 * len(widths)


def rich_table(t: TableData, width: int | None = None) -> Table:
    """The terminal's table; in a console narrower than ``width`` would need, columns with
    nothing to show are left out and header words are stacked so that the cells set the
    widths (the Markdown and HTML reports keep everything)."""
    t = with_misses_below(with_short_knee_mark(t))
    narrow = width is not None and natural_width(t) > width
    if narrow:
        t = without_empty_columns(t)
    out = Table(
        title=t.title,
        title_justify="left",
        header_style="bold",
        box=box.SIMPLE_HEAD,
        collapse_padding=True,
        pad_edge=False,
    )
    for i, h in enumerate(t.head):
        out.add_column(
            h.replace(" ", "\n").replace("-", "-\n") if narrow else h,
            justify="left" if i == 0 else "right",
            no_wrap=narrow and all(len(r[i]) <= FIGURE_WIDTH for r in t.rows),  # text wraps
        )
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
    console.print(Fitted(rich_table(sweep_table(run), console.width)))
    for t in all_tables(run):
        console.print(Fitted(rich_table(t, console.width)))
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
