"""What the planned rate rests on, in the terminal: the long runs (sustainability), the
verification at fresh seeds, the headroom. Pure: a ``Plan`` in, rich renderables out."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from . import sustain
from .model_error import describe_axis

if TYPE_CHECKING:
    from .planner import Plan


def _seeds(seeds: list[int]) -> str:
    return ", ".join(map(str, seeds))


def sustainability(plan: Plan) -> Iterator[RenderableType]:
    sus = plan.sustainability
    if sus is None:
        yield Text(
            "Screening only (--no-sustain): the rate above held over one short window; a "
            "queue that grows slowly is not seen in it, so it may not hold in production.",
            style="yellow",
        )
        return
    s = plan.request.settings
    yield Text(
        "Sustainability: a one-minute window cannot see a queue that grows slowly, so the "
        f"finalists' searches are repeated on long runs — at least {s.long_window:g} s and "
        f"{s.long_e2e_multiple:g} x the P99 end-to-end latency (with bursts, three whole "
        f"periods), after a warm-up of at least {s.long_warmup:g} s and twice that P99, on "
        f"seed(s) {_seeds([s.seed + k for k in s.long_seeds])}"
        f". A rate holds when, on every seed, the SLO is met over the window and over its last "
        f"third, at least {sustain.MIN_FINISHED_SHARE:.0%} of the requests sent finish inside "
        "it, and the queue of requests waiting for a first token does not grow (Theil-Sen "
        "slope over 12 bins); a run whose queue runs away is stopped early. Steps of "
        f"{1 + s.rel_tol:g}x down from the screened rate, then bisection."
    )
    t = Table(title="sustainability (long runs)", title_justify="left", header_style="bold")
    pct = f"P{plan.request.slo.percentile:g}"
    for c in ("configuration", "window", "rates simulated (req/s)", "sustains", f"{pct} there"):
        t.add_column(c, justify="right" if c in ("window", "sustains") else "left")
    for r in sus.results:
        pts = sorted(r.points, key=lambda p: p.rate)
        b = r.best
        worst = b or r.lowest
        t.add_row(
            r.candidate.label + (" ◀" if r is sus.chosen else ""),
            f"{worst.duration - worst.warmup:,.0f} s" if worst else "-",
            " ".join(f"{p.rate:g}{'✓' if p.ok else '✗'}" for p in pts),
            f"{r.max_rate:g}" if b else "-",
            _worst(worst) if worst else "-",
        )
    yield t
    for old in sus.rejected:
        worst = old.attempts[-1] if old.attempts else None
        yield Text.assemble(
            ("✗ ", "red"),
            f"{old.chosen.candidate.label} held {old.chosen.max_rate:g} req/s on the search's "
            "seed but no step of its verification held on fresh seeds ("
            + ", ".join(f"{a.rate:g}" for a in old.attempts)
            + (f" req/s; at {worst.rate:g}: {worst.why}" if worst else "")
            + "): the next finalist is verified instead.",
        )
    yield Text.assemble(("long runs: ", "bold"), sus.reason + ".")
    for a in sus.attempts:
        mark, style = ("✓ ", "green") if a.ok else ("✗ ", "red")
        w = a.worst
        yield Text.assemble(
            (mark, style),
            f"verification at {a.rate:g} req/s on fresh seeds {_seeds(a.seeds)}, "
            f"{w.duration - w.warmup:,.0f} s windows: {a.why}.",
        )
    yield recommendation(plan)
    yield from twin_error(plan)


def twin_error(plan: Plan) -> Iterator[RenderableType]:
    """The twin's measured error in this regime, carried into the headroom and the break."""
    e = plan.model_error
    o = plan.recommended_point
    slo = plan.request.slo
    lt, li = slo.limits_of(o.slo_class)
    t, i = plan.with_error(o)
    grow = (
        f"TTFT up to {e.ttft_factor - 1:+.0%}, ITL up to {e.itl_factor - 1:+.0%}, "
        f"sustainable rate {e.rate_factor - 1:+.0%}"
    )
    axis, level = e.weakest
    weakest = describe_axis(axis, e.entries.get(axis), e.regime[axis]).split(":")[0]
    where = (
        ""
        if plan.gpu.name.startswith("H200")
        else f"; the band covers {plan.gpu.name}'s own figures"
    )
    parts = [
        f"this answer's regime: {e.describe()} (docs/validation.md, measured on one H200{where}). "
        f"Validated no better than its weakest axis, {weakest} ({level}). The twin's worst "
        "measured error there: " + grow + "."
    ]
    if t is not None and lt:
        shown = f"TTFT P{slo.percentile:g} {o.ttft:.2f} s → up to {t:.2f} s"
        if i is not None and li:
            shown += f", ITL {o.itl * 1e3:.0f} → up to {i * 1e3:.0f} ms"
        parts.append(f"At the recommended rate ({o.rate:g} req/s): {shown}.")
    sus = plan.sustainability
    if sus is not None and sus.headroom is not None:
        b = plan.breaks_with_error
        parts.append(
            f"With that error the SLO breaks at about {b:.3g} req/s on the long runs"
            f" ({sus.headroom:g} with the twin as it is)."
            if b is not None
            else f"With that error no long run broke the SLO below {sus.headroom:g} req/s."
        )
    over = (t is not None and lt and t > lt) or (i is not None and li and i > li)
    yield Text.assemble(("model error: ", "bold"), " ".join(parts))
    if over:
        yield Text(
            "With the twin's measured error in this regime the SLO may already break at the "
            "recommended rate: measure it (servefleet bench) before relying on it.",
            style="bold red",
        )
    for note in e.notes():
        yield Text(f"note: {note}", style="dim")


def _worst(p) -> str:
    w = p.worst
    if w.stopped_at is not None:
        return f"stopped at {w.stopped_at:.0f} s (seed {w.seed})"
    itl = "-" if w.itl is None else f"{w.itl * 1e3:.0f} ms"
    ttft = "-" if w.ttft is None else f"{w.ttft:.2f} s"
    return f"TTFT {ttft}, ITL {itl} (seed {w.seed})"


def recommendation(plan: Plan) -> Text:
    sus = plan.sustainability
    assert sus is not None
    r = sus.rate
    if not sus.ok:
        return Text(
            f"No rate verified: the last one tried, {r:g} req/s, still missed on a fresh seed. "
            "Treat this plan's rate as an upper bound and measure before you rely on it.",
            style="bold red",
        )
    check = plan.band.pessimistic if plan.band is not None else None
    if check is None:
        head = f"operate at or below {r:g} req/s"
    elif check.rate is None:
        return Text.assemble(
            ("recommendation: ", "bold"),
            (
                f"no rate is known to hold at the pessimistic end of the band ({check.corner} "
                f"corner): {r:g} req/s holds only with the engine model's nominal figures. "
                "Measure before you rely on it (the band below says which figures).",
                "bold red",
            ),
        )
    else:
        head = (
            f"operate at or below {check.rate:g} req/s, the rate that holds at the pessimistic "
            f"end of the band ({check.corner} corner, long runs); {r:g} req/s with the engine "
            "model's nominal figures"
        )
    if sus.headroom is None:
        return Text.assemble(
            ("recommendation: ", "bold"), head + " (no rate above it was seen failing)."
        )
    gap = sus.headroom / r - 1
    knee = (
        f" The knee of its screened rates (docs/metrics.md) is at {plan.knee_rate:g} req/s."
        if plan.knee_rate
        else ""
    )
    return Text.assemble(
        ("recommendation: ", "bold"),
        f"{head}. Headroom: with the nominal figures the SLO first breaks at about "
        f"{sus.headroom:g} req/s on long runs ({gap:.0%} above {r:g}); past it the queue grows "
        "and TTFT climbs without bound, so keep the offered rate below it with the gateway's "
        "admission cap (step 9) or more replicas (--target-rate)." + knee,
    )


def _pct(v: float) -> str:
    return f"{v - 1:+.0%}"


def band(plan: Plan) -> Iterator[RenderableType]:
    b = plan.band
    if b is None:
        return
    if b.measured:
        yield Text(
            f"Every engine-model figure of {b.gpu} that the plan rests on is measured on it: no "
            "band to state."
        )
        return
    yield Text.assemble(
        ("Uncertainty. ", "bold"),
        f"On {b.gpu} these figures of the engine model are not measured on this GPU; each has a "
        "plausible range (hardware.parameter_bands). The cost model's capacity estimate at each "
        "end, the rest nominal (sensitivity), then every topology screened again with all of "
        "them at the corners (simulated):",
    )
    t = Table(title="what the prediction rests on", title_justify="left", header_style="bold")
    for c in ("figure", "nominal", "range", "basis", b.chosen.label, "runner-up"):
        t.add_column(c, justify="left" if c in ("figure", "basis") else "right")
    for p in b.parameters:
        t.add_row(
            p.name,
            f"{p.nominal:.3g}",
            f"{p.band.low:.3g} - {p.band.high:.3g}",
            p.band.basis,
            f"{_pct(p.chosen[0])} / {_pct(p.chosen[1])}",
            "-" if p.runner_up is None else f"{_pct(p.runner_up[0])} / {_pct(p.runner_up[1])}",
        )
    t.caption = (
        "estimate at the low / high end of the range vs nominal (cost model). Sources: "
        + "; ".join(sorted({p.band.source for p in b.parameters}))
    )
    yield t
    for tb in b.topologies:
        rng = tb.range()
        cells = ", ".join(
            f"{c} " + ("no rate holds" if v == 0 else f"{v:.3g}")
            for c in tb.corners
            if (v := tb.scaled(c)) is not None
        )
        low = "no rate holds" if rng and rng[0] == 0 else f"{rng[0]:.3g}" if rng else ""
        yield Text.assemble(
            ("band ", "bold"),
            f"{tb.label}: sustains {tb.level:g} req/s at nominal; "
            + (f"{low} - {rng[1]:.3g} req/s inside the band " if rng else "")
            + f"({cells}; scaled from screening at each corner).",
        )
    yield from _pessimistic(b)
    if b.runner_up is None:
        return
    rr = b.ratio_range()
    nominal = b.ratio()
    if nominal is None:
        return
    a, c = b.chosen.range(), b.runner_up.range()
    ratio = f"{nominal:.2f} at nominal" + (
        f", {rr[0]:.2f} - {rr[1]:.2f} at the corners" if rr is not None else ""
    )
    if b.overlap:
        verdict = (
            f"the bands overlap ({_span(a)} and {_span(c)} req/s): which one sustains more is "
            "not settled by the model"
        )
    elif b.can_flip:
        verdict = "the ratio crosses 1 at some corner: the ranking can flip"
    else:
        verdict = f"the bands do not overlap ({_span(a)} vs {_span(c)} req/s): the ranking holds"
    yield Text.assemble(
        ("ranking: ", "bold"),
        f"{b.runner_up.label} ÷ {b.chosen.label} = {ratio}; {verdict}.",
        style="bold yellow" if b.can_flip else "",
    )
    if plan.settle:
        yield Text(
            "One measurement on one node settles it (the figures it rests on are the "
            "tensor-parallel collectives and the GPU's efficiencies):",
            style="bold",
        )
        for line in plan.settle:
            yield Text(line, style="dim" if line.startswith("#") else "cyan")


def _span(rng: tuple[float, float] | None) -> str:
    if rng is None:
        return "-"
    low = "no rate" if rng[0] == 0 else f"{rng[0]:.3g}"
    return f"{low} - {rng[1]:.3g}"


def _pessimistic(b) -> Iterator[RenderableType]:
    check = b.pessimistic
    if check is None:
        return
    tried = (
        " ".join(
            f"{p.rate:g}{'✓' if p.ok else '✗'}"
            for p in sorted(check.result.points, key=lambda p: p.rate)
        )
        if check.result is not None
        else ""
    )
    if check.rate is not None:
        head = (
            f"at the {check.corner} corner (the band's lowest), long runs at a fresh seed hold "
            f"{check.rate:g} req/s ({tried}): the recommended rate."
        )
    elif check.result is None:
        head = (
            f"at the {check.corner} corner (the band's lowest) no rate held in screening: no "
            "rate is known to hold at the pessimistic end."
        )
    else:
        head = (
            f"at the {check.corner} corner (the band's lowest) no rate tried on long runs held "
            f"({tried}): no rate is known to hold at the pessimistic end."
        )
    yield Text.assemble(("pessimistic end: ", "bold"), head)
    if check.simulate_command:
        yield Text.assemble(("reproduce it: ", "bold"), check.simulate_command)


def long_pool(plan: Plan) -> Iterator[RenderableType]:
    """The long-prompt pool against one pool, at the rate one pool holds (screening)."""
    from .planner import LONG_POOL_VARIANT

    split = next((r for r in plan.variants if r.candidate.variant == LONG_POOL_VARIANT), None)
    one = next(
        (r for r in plan.topologies if r.candidate.name == (split and split.candidate.name)), None
    )
    if split is None or one is None or one.best is None:
        return
    rate = one.max_rate
    a = one.best
    b = next((p for p in split.points if p.rate == rate), None)
    if b is None:
        return
    pct = f"P{plan.request.slo.percentile:g}"
    won = split.best is not None and split.max_rate > one.max_rate
    yield Text.assemble(
        ("long-prompt pool: ", "bold"),
        f"{split.candidate.policy} with {split.candidate.long_replicas} of "
        f"{one.candidate.deployment.replicas} replicas for prompts over 1,500 tokens, on "
        f"{one.candidate.name}, at {rate:g} req/s (where one pool "
        f"holds): goodput {b.summary.goodput:.3g} req/s vs {a.summary.goodput:.3g} with one "
        f"pool, TTFT {pct} {b.ttft:.2f} s vs {a.ttft:.2f} s — "
        + (
            f"the split holds up to {split.max_rate:g} req/s: it beats one pool."
            if won
            else "it does not beat one pool here (both simulated at this rate, same seed)."
        ),
    )


def hosts(plan: Plan) -> Iterator[RenderableType]:
    """Several hosts: what the replicas across hosts are, and what a replica spanning hosts
    would cost (its all-reduces over the network), from the screening."""
    req = plan.request
    if req.hosts < 1 or req.hosts == 1:
        return
    inside = [r for r in plan.topologies if r.candidate.deployment.tp <= req.num_gpus]
    spanning = [r for r in plan.topologies if r.candidate.deployment.tp > req.num_gpus]
    yield Text.assemble(
        ("hosts: ", "bold"),
        f"{req.hosts} hosts x {req.num_gpus} GPUs. Replicas inside a host are simulated "
        "together behind one gateway (every rate above is the whole fleet's, simulated — not "
        "one host's rate doubled).",
    )
    best_in = max((r for r in inside if r.best), key=lambda r: r.max_rate, default=None)
    for r in spanning:
        link = r.candidate.deployment.gpu.interconnect
        held = f"holds {r.max_rate:g} req/s" if r.best else "holds no rate tried"
        vs = f" vs {best_in.max_rate:g} for {best_in.candidate.name}" if best_in else ""
        why = r.candidate.deployment.model.name
        yield Text(
            f"{r.candidate.name}: its all-reduces cross the network ({link.description}; "
            f"{link.bandwidth / 1e9:g} GB/s per GPU, {link.latency_s * 1e6:g} us per "
            f"collective): screened, it {held}{vs}. Not chosen: a replica of {why} spanning "
            "hosts needs a Ray cluster, which fleet.yaml and `servefleet up` do not start; "
            "pipeline parallelism across hosts is not modelled."
        )
    if not spanning:
        yield Text(
            f"No tensor-parallel size spans hosts: {plan.model.name}'s heads do not split over "
            f"{req.num_gpus * 2} GPUs, or it fits inside one host; pipeline parallelism across "
            "hosts is not modelled."
        )
