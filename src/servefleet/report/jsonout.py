"""A run as JSON, every figure recomputed from the records (pure)."""

from __future__ import annotations

from servefleet.report.figures import knee_of
from servefleet.report.run import RunData


def render_json(run: RunData) -> dict:
    knee = knee_of(run)
    return {
        "title": run.title,
        "kind": run.kind,
        "slo": {"ttft": run.slo.ttft, "itl": run.slo.itl},
        "knee": knee.label if knee else None,
        "points": [
            {
                "label": p.label,
                "load": {"concurrency": p.concurrency, "rate": p.rate},
                "summary": run.summary(p).to_dict(),
                "selfcheck": p.raw.get("selfcheck"),
                "server": p.raw.get("server"),
            }
            for p in run.sorted_points()
        ],
    }
