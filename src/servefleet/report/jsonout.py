"""A run as JSON, every figure recomputed from the records (pure)."""

from __future__ import annotations

from servefleet.report.figures import knee_of
from servefleet.report.header import header_rows
from servefleet.report.run import RunData
from servefleet.report.verdict import verdict_lines


def render_json(run: RunData) -> dict:
    knee = knee_of(run)
    return {
        "title": run.title,
        "kind": run.kind,
        "complete": run.complete,
        "header": dict(header_rows(run)),
        "verdict": [line.strip() for line in verdict_lines(run)],
        "slo": {"ttft": run.slo.ttft, "itl": run.slo.itl},
        "class_slos": {k: {"ttft": v.ttft, "itl": v.itl} for k, v in run.class_slos.items()},
        "max_error_rate": run.max_error_rate,
        "knee": knee.label if knee else None,
        "points": [
            {
                "label": p.label,
                "load": {"concurrency": p.concurrency, "rate": p.rate},
                "failed": run.failed(p),
                "summary": run.summary(p).to_dict(),
                "selfcheck": p.raw.get("selfcheck"),
                "server": p.raw.get("server"),
                "gpu": (p.raw.get("telemetry") or p.raw.get("gpu_busy") or {}).get("figures"),
            }
            for p in run.sorted_points()
        ],
    }
