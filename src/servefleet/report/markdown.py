"""A run as Markdown: header, verdict, the summary table, per-class/turn tables and the rest of
``report.tables`` (what the terminal shows, for a PR or a wiki page)."""

from __future__ import annotations

from collections.abc import Sequence

from servefleet.report.header import header_rows
from servefleet.report.run import RunData
from servefleet.report.tables import TableData, all_tables, client_warnings, sweep_table
from servefleet.report.verdict import verdict_lines


def md_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    def cell(x: object) -> str:
        return str(x).replace("|", "\\|")

    lines = [
        "| " + " | ".join(cell(h) for h in head) + " |",
        "|" + "|".join("---" if i == 0 else "---:" for i in range(len(head))) + "|",
    ]
    lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def md_section(t: TableData) -> str:
    rows = [
        [f"**{r[0]}**" if m == "failed" else r[0], *r[1:]]
        for r, m in zip(t.rows, t.marks, strict=True)
    ]
    cap = f"\n\n_{t.caption}_" if t.caption else ""
    return f"### {t.title}\n\n{md_table(t.head, rows)}{cap}\n"


def render_markdown(run: RunData) -> str:
    out = [f"# {run.title}", ""]
    out += [f"- **{label}**: {text}" for label, text in header_rows(run)]
    out += ["", "## Verdict", ""]
    out += [
        ("  - " if line.startswith("  ") else "- ") + line.strip() for line in verdict_lines(run)
    ]
    out += ["", md_section(sweep_table(run))]
    out += [md_section(t) for t in all_tables(run)]
    warns, _ = client_warnings(run)
    if warns:
        out += ["**WARNING: the client was the bottleneck at some points:**", ""]
        out += [f"- {w}" for w in warns]
    return "\n".join(out).rstrip() + "\n"
