"""The verdict a team reads first: up to which load the SLOs held, where the knee is, and how
much headroom is left (pure: a run in, sentences out).

Rule: a sweep *meets its SLOs up to* the highest load whose point, and every lighter one, held
them (``stats.slo_failures``: TTFT P95, ITL P95, errors ≤ --max-error-rate, every request
counted). *Headroom* is what the SLOs still allow at that load: the share of each latency budget
used. The knee is ``stats.find_knee``'s. An SLO search states its own result instead. Each class
with its own requests gets the same verdict under its own SLOs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from servefleet.report.figures import knee_of
from servefleet.report.run import PointData, RunData
from servefleet.stats import SLO, Summary, slo_failures


@dataclass(frozen=True, slots=True)
class Verdict:
    met_up_to: PointData | None
    """The highest load that held its SLOs with every lighter load (None: even the lightest
    failed)."""
    first_failed: PointData | None
    why: list[str] = field(default_factory=list)
    """Why ``first_failed`` did not hold its SLOs."""
    headroom: list[str] = field(default_factory=list)
    """At ``met_up_to``: each latency's P95 as a share of its SLO."""


def verdict_of(
    points: list[PointData],
    summaries: list[Summary],
    slo: SLO,
    max_error_rate: float,
    classes: dict[str, SLO] | None = None,
) -> Verdict:
    """``classes``: judge only these classes, each on its own (``stats.slo_failures``)."""
    met = None
    for p, s in zip(points, summaries, strict=True):
        why = slo_failures(s, slo, max_error_rate, classes)
        if why:
            return Verdict(met, p, why, _headroom(met, points, summaries, slo, classes))
        met = p
    return Verdict(met, None, [], _headroom(met, points, summaries, slo, classes))


def _headroom(
    met: PointData | None,
    points: list[PointData],
    summaries: list[Summary],
    slo: SLO,
    classes: dict[str, SLO] | None = None,
) -> list[str]:
    if met is None:
        return []
    s = summaries[points.index(met)]
    if classes is not None:
        return [
            f"class {name}: " + ", ".join(_headroom(met, [met], [part], own))
            for name, own in classes.items()
            if (part := s.by_class.get(name) if s.by_class else s) is not None
        ]
    out = []
    if slo.ttft and s.ttft.p95 is not None:
        out.append(f"TTFT P95 {s.ttft.p95 / slo.ttft:.0%} of its SLO")
    if slo.itl and s.itl.p95 is not None:
        out.append(f"ITL P95 {s.itl.p95 / slo.itl:.0%}")
    return out


def slo_text(slo: SLO, max_error_rate: float) -> str:
    parts = []
    if slo.ttft is not None:
        parts.append(f"TTFT P95 ≤ {slo.ttft:g} s")
    if slo.itl is not None:
        parts.append(f"ITL P95 ≤ {slo.itl * 1000:g} ms")
    parts.append(f"errors ≤ {max_error_rate:.0%}")
    return ", ".join(parts)


def verdict_lines(run: RunData) -> list[str]:
    """The run's verdict in a few sentences (the same in every format)."""
    pts = run.sorted_points()
    if not pts:
        return ["no point ran"]
    out = []
    if not run.complete:
        planned = run.meta.get("points_planned")
        of = f" of {planned}" if planned else ""
        out.append(
            f"INCOMPLETE run: {len(pts)}{of} points ran (it was interrupted or killed); "
            "what follows covers only those"
        )
    search = run.meta.get("search")
    if search:
        best = search.get("highest_rate_held")
        out.append(
            "SLO search: "
            + (f"the highest rate that held its SLOs is {best:g} req/s" if best else "no rate held")
            + f" ({slo_text(run.slo, run.max_error_rate)})"
        )
    else:
        what = "SLOs"
        if run.slo_classes is not None:
            what = f"SLOs of classes {', '.join(run.slo_classes)}, each on its own"
        out.append(
            _sweep_sentence(run, pts, [run.summary(p) for p in pts], run.slo, what, run.slo_classes)
        )
    knee = knee_of(run)
    if knee is not None:
        out.append(f"knee at {knee.label}: beyond it, more load buys little throughput")
    elif len(pts) > 1 and not search:
        out.append("no knee in this sweep: throughput still grew with the load")
    out += class_verdicts(run, pts)
    failed = [p.label for p in pts if run.failed(p)]
    if failed:
        out.append(
            f"FAILED points (more than {run.max_error_rate:.0%} of their requests failed): "
            + ", ".join(failed)
        )
    return out


def _sweep_sentence(
    run: RunData,
    pts: list[PointData],
    summaries: list[Summary],
    slo: SLO,
    what: str,
    classes: dict[str, SLO] | None = None,
) -> str:
    v = verdict_of(pts, summaries, slo, run.max_error_rate, classes)
    limits = (
        slo_text(slo, run.max_error_rate)
        if classes is None
        else "; ".join(f"{n}: {slo_text(s, run.max_error_rate)}" for n, s in classes.items())
    )
    slos = f"{what} ({limits})"
    if v.met_up_to is None:
        return f"{slos} held at no point: at {pts[0].label}, " + "; ".join(v.why)
    room = f"; headroom there: {', '.join(v.headroom)}" if v.headroom else ""
    if v.first_failed is None:
        return f"{slos} held at every point, up to {v.met_up_to.label} (the heaviest tried){room}"
    return f"{slos} held up to {v.met_up_to.label}{room}; at {v.first_failed.label}: " + "; ".join(
        v.why
    )


def class_verdicts(run: RunData, pts: list[PointData]) -> list[str]:
    """One sentence per class (under its own SLOs), when the workload has several."""
    names = list(dict.fromkeys(n for p in pts for n in run.summary(p).by_class))
    out = []
    for name in names:
        sub = [(p, run.summary(p).by_class.get(name)) for p in pts]
        sub = [(p, s) for p, s in sub if s is not None and s.num_requests]
        if not sub:
            continue
        slo = run.class_slos.get(name, run.slo)
        out.append(
            "  "
            + _sweep_sentence(run, [p for p, _ in sub], [s for _, s in sub], slo, f"class {name}")
        )
    return out
