"""A run as Markdown: the summary table, the knee, self-check warnings."""

from __future__ import annotations

from collections.abc import Sequence

from servefleet.report.figures import FIGURES, extras, knee_of
from servefleet.report.knee import KneeRule
from servefleet.report.run import RunData


def md_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    def cell(x: object) -> str:
        return str(x).replace("|", "\\|")

    lines = [
        "| " + " | ".join(cell(h) for h in head) + " |",
        "|" + "|".join("---" if i == 0 else "---:" for i in range(len(head))) + "|",
    ]
    lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def render_markdown(run: RunData) -> str:
    pts = run.sorted_points()
    knee = knee_of(run)
    ex = [extras(run, p) for p in pts]
    keys = list(ex[0]) if ex else []
    head = [
        "load",
        "ok/sent",
        *[f.name + (" ms" if f.unit == "ms" else "") for f in FIGURES],
        *keys,
    ]
    rows = []
    for p, e in zip(pts, ex, strict=True):
        s = run.summary(p)
        label = p.label + (" **knee**" if p is knee else "")
        rows.append(
            [
                label,
                f"{s.num_ok}/{s.num_requests}",
                *[f.fmt(f.get(s)) for f in FIGURES],
                *[e[k] for k in keys],
            ]
        )
    out = [f"# {run.title}", "", md_table(head, rows), ""]
    rule = KneeRule().describe()
    out.append(f"Knee at {knee.label}: {rule}." if knee else f"No knee in this sweep ({rule}).")
    out.append(f"SLOs: TTFT <= {run.slo.ttft} s, TPOT <= {run.slo.itl} s.")
    warns = [(p.label, w) for p in pts for w in (p.raw.get("selfcheck") or {}).get("warnings", [])]
    if warns:
        out += ["", "**WARNING: the client was the bottleneck at some points:**", ""]
        out += [f"- {label}: {w}" for label, w in warns]
    return "\n".join(out) + "\n"
