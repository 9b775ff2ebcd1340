"""The plan in the terminal: step by step, every number with where it comes from.

Pure: a ``Plan`` in, rich renderables out (the CLI prints them; docs/plan.md records them).
"""

from __future__ import annotations

from collections.abc import Iterator

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from servefleet.engine.memory import GiB
from servefleet.report.fit import Heading, fitted
from servefleet.report.tables import LATENCY_HEAD, WINDOW_NOTE, TableData, latency_row, pct
from servefleet.report.terminal import rich_table

from .band import rests_on
from .memory_table import MemoryRow, graphs_in_budget
from .planner import STAGE1_GROW, Plan
from .precision import quality_check
from .render import served_path
from .report_evidence import band, hosts, long_pool, sustainability
from .search import CandidateResult, Outcome


def _gib(n: float) -> str:
    return f"{n / GiB:,.2f}"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:,.0f} ms" if v >= 0.01 else f"{v * 1e3:,.1f} ms"


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:,.2f} s"


def _heading(n: int, title: str) -> Heading:
    return Heading(Text(f"{n}. {title}", style="bold"))


def _para(text: str, style: str | None = None) -> Text:
    return Text(text, style=style)


def render_plan(plan: Plan) -> list[RenderableType]:
    """The plan's sections; each table fits the width it is drawn in (``report.fit``)."""
    return fitted(_sections(plan))


def _sections(plan: Plan) -> Iterator[RenderableType]:
    req, m, g = plan.request, plan.model, plan.gpu
    yield Text.assemble(
        ("servefleet plan: ", "bold"),
        f"{m.name} on {req.total_gpus} x {g.name}"
        + (f" ({req.hosts} hosts x {req.num_gpus})" if req.hosts > 1 else "")
        + f", workload {plan.profile.name}, SLO {req.slo.describe()}",
    )
    yield from _inputs(plan)
    yield from _workload(plan)
    yield from _precision(plan)
    yield from _memory(plan)
    yield from _flags(plan)
    yield from _bounds(plan)
    yield from _search(plan)
    yield from _prediction(plan)
    yield from _gateway(plan)
    yield from _capacity(plan)
    yield from _plausibility(plan)
    yield from _deploy(plan)


# ---- 1 ----------------------------------------------------------------------------------------


def _inputs(plan: Plan):
    m, g, req = plan.model, plan.gpu, plan.request
    yield _heading(1, "Model and GPUs")
    kv = m.kv_bytes_per_token("fp16")
    yield _para(
        f"{m.name}: {m.num_params / 1e9:.2f}B parameters ({m.num_layers} layers, hidden "
        f"{m.hidden_size:,}, {m.num_attention_heads} attention heads / {m.num_kv_heads} KV heads "
        f"of {m.head_dim}, MLP {m.intermediate_size:,}, vocabulary {m.vocab_size:,}); stored in "
        f"{plan.precision.stored}; KV cache per token = 2 x {m.num_layers} layers x "
        f"{m.num_kv_heads} KV heads x {m.head_dim} x 2 bytes = {kv:,} bytes in fp16."
    )
    yield _para(f"--model {req.model}: {served_path(m, req.model)[1]}.")
    yield _para(
        f"{g.name}: {g.memory_bytes / GiB:.2f} GiB as CUDA reports it, "
        f"{g.hbm_bandwidth / 1e9:,.0f} GB/s HBM, {g.flops['fp16'] / 1e12:.0f} TFLOP/s fp16 "
        f"(dense, datasheet), {'bf16' if g.bf16 else 'no bf16'}, compute capability "
        f"{'.'.join(map(str, g.compute_capability))}, {g.interconnect.description}; "
        f"{req.num_gpus} per host x {req.hosts} host(s) = {req.total_gpus} GPUs."
    )


# ---- 2 ----------------------------------------------------------------------------------------


def _workload(plan: Plan):
    p = plan.profile
    yield _heading(2, f"Workload: {p.num_requests:,} requests drawn from {p.name}")
    rate = f"{p.nominal_rate:.4g} req/s as written" if p.nominal_rate else "a closed loop"
    how = (
        f"the {p.num_requests:,} requests of the trace"
        if p.trace_records
        else f"a dry run of the workload at its own rate ({rate}), seed {plan.request.settings.seed}"
    )
    yield _para(
        f"Measured on {how}; lengths are tokens, a session turn's prompt includes its history."
    )
    t = Table(header_style="bold", title_justify="left")
    for c in ("class", "share", "mean prompt", "mean output", "max prompt + output", "sessions"):
        t.add_column(c, justify="left" if c == "class" else "right")
    for c in p.classes:
        t.add_row(
            c.name,
            f"{c.share:.1%}",
            f"{c.mean_prompt:,.0f}",
            f"{c.mean_output:,.0f}",
            f"{c.max_total:,}",
            "yes" if c.sessions else "",
        )
    yield t
    pct = ", ".join(f"P{q} {p.total_percentile(q):,}" for q in (50, 90, 95, 99))
    yield _para(
        f"prompt + output: mean {p.mean_total:,.0f} ({p.mean_prompt:,.0f} + "
        f"{p.mean_output:,.0f}); {pct}; max {p.total_percentile(100):,}."
    )
    bs = plan.glob.block_size
    yield _para(
        f"shared prefixes: {p.shared_fraction(bs):.1%} of prompt tokens repeat, in full "
        f"{bs}-token blocks, what an earlier request already computed."
    )
    b = p.burst
    if b is not None:
        every = f" every {b.period:.4g} s at the nominal rate" if b.period else ""
        yield _para(
            f"bursts: {b.size} requests ({', '.join(b.classes)}) arrive at the same instant{every} "
            f"— {sum(b.prompt_tokens):,} prompt tokens at once; {b.share:.1%} of requests come in "
            "bursts. Scaling the rate keeps the burst size and shortens the period, so each "
            "simulated point measures a whole number of periods."
        )


# ---- 3 ----------------------------------------------------------------------------------------


def _precision(plan: Plan):
    pr = plan.precision
    yield _heading(3, "Precision")
    yield _para(f"dtype {pr.dtype} (vLLM --dtype {pr.vllm_dtype}): {pr.reason}.")
    tp = plan.deployment.tp
    t = Table(
        title=f"weight quantization, what it would change (TP={tp})",
        title_justify="left",
        header_style="bold",
    )
    for c in ("format", "weights / GPU", "decode bound", "on this GPU", "speed"):
        t.add_column(c, justify="right" if c in ("weights / GPU", "decode bound") else "left")
    for q in plan.quantization:
        t.add_row(
            q.name,
            f"{_gib(q.weights_per_gpu)} GiB",
            _ms(q.decode_bound_s),
            q.how if q.supported else f"no: {q.how}",
            q.speed + ("" if q.simulated else " (not simulated)"),
        )
    t.caption = (
        "decode bound: weights per GPU ÷ HBM bandwidth, the shortest possible decode step. "
        "4-bit: 0.5 byte/weight + a 16-bit scale and 4-bit zero per 128 weights; embeddings and "
        "norms stay 16-bit. 'on this GPU' follows vLLM's quantization hardware table."
    )
    yield t
    check = quality_check(pr.dtype, plan.request.overrides.kv_cache_dtype, plan.quantization)
    if check is not None:
        offered, command = check
        yield _para(
            f"output quality: before serving {offered}, measure what it changes in the answers "
            "to your own prompts: start the 16-bit deployment (REFERENCE) and the lower "
            "precision (CANDIDATE) and run"
        )
        yield _para(f"  {command}", style="bold")
        yield _para(
            '  (one prompt a line, or {"prompt", "answer"} lines for the accuracy of each side; '
            "docs/quality.md)"
        )


# ---- 4 ----------------------------------------------------------------------------------------


def _memory(plan: Plan):
    rows = plan.memory
    yield _heading(4, "Memory per GPU, for each tensor-parallel size")
    shown = [r for r in rows if r.memory is not None]
    t = Table(header_style="bold")
    t.add_column("per GPU (GiB unless said)")
    for r in shown:
        t.add_column(f"TP={r.tp}\n{r.replicas} replica(s)", justify="right")
    t.add_column("from")

    def row(name: str, f, why: str) -> None:
        t.add_row(name, *(f(r) for r in shown), why)

    u = shown[0].flags.gpu_memory_utilization if shown else 0.0
    graphs_in = any(graphs_in_budget(r.memory) for r in shown)
    row("GPU memory", lambda r: _gib(r.memory.total), "as CUDA reports it")
    row(f"x gpu-memory-utilization {u:g}", lambda r: _gib(r.memory.budget), "what vLLM may use")
    row(
        "- weights",
        lambda r: _gib(r.memory.weights),
        f"{plan.model.num_params / 1e9:.2f}B params in {plan.precision.dtype} ÷ TP",
    )
    row(
        "- activation peak",
        lambda r: _gib(r.memory.activation_peak),
        "profiling forward of max-num-batched-tokens tokens, or the sampler's logits",
    )
    row(
        "- non-torch (NCCL per extra GPU)",
        lambda r: _gib(r.memory.non_torch),
        "assumed, see engine/memory.py",
    )
    if graphs_in:
        row("- CUDA graphs", lambda r: _gib(r.memory.cuda_graphs), "captured decode graphs")
    row("= KV cache", lambda r: _gib(r.memory.kv_cache), "what is left")
    row(
        "KV bytes per token per GPU",
        lambda r: f"{r.memory.kv_bytes_per_token:,}",
        "2 x layers x KV heads ÷ TP x head dim x 2 bytes",
    )
    row(
        "KV blocks",
        lambda r: f"{r.memory.num_gpu_blocks:,}",
        "KV cache ÷ (bytes per token x block size)",
    )
    row("KV tokens = longest context", lambda r: f"{r.longest_context:,}", "blocks x block size")
    row(
        "concurrency that fits",
        lambda r: f"{r.concurrency:,.1f}",
        f"KV tokens ÷ mean prompt + output ({plan.profile.mean_total:,.0f})",
    )
    row(
        "flags assumed",
        lambda r: f"{r.flags.max_num_batched_tokens} / {r.flags.max_num_seqs}",
        "max-num-batched-tokens / max-num-seqs (step 5)",
    )
    row(
        "runs?",
        lambda r: "yes" if r.feasible else "no",
        f"KV tokens >= max-model-len {plan.glob.max_model_len:,}",
    )
    if not graphs_in and shown:
        t.caption = (
            f"CUDA graphs ({_gib(shown[0].memory.cuda_graphs)} GiB) are captured after the KV "
            "cache is sized, in the memory outside gpu-memory-utilization (vLLM V1)."
        )
    yield t
    for r in rows:
        if not r.feasible:
            yield _para(f"TP={r.tp}: {r.problem}.", "yellow")


# ---- 5 ----------------------------------------------------------------------------------------


def _flags(plan: Plan):
    chosen = plan.chosen.candidate
    f = plan.flags
    yield _heading(5, f"vLLM flags (for {chosen.name}, the chosen topology)")
    feasible = [r for r in plan.memory if r.feasible]
    t = Table(header_style="bold")
    t.add_column("flag")
    for r in feasible:
        t.add_column(f"TP={r.tp}", justify="right")
    for name in ("max_num_batched_tokens", "max_num_seqs"):
        t.add_row("--" + name.replace("_", "-"), *(str(getattr(r.flags, name)) for r in feasible))
    t.caption = "the rules' per-TP flags (the others are the same for every TP)"
    yield t
    values = f.values()
    for name, why in f.reasons:
        v = values[name]
        shown = (
            ("on" if v else "off")
            if isinstance(v, bool)
            else f"{v:,}"
            if isinstance(v, int)
            else f"{v:g}"
        )
        yield Text.assemble(("--" + name.replace("_", "-") + f" {shown}", "bold cyan"), f": {why}.")


# ---- 6 ----------------------------------------------------------------------------------------


def _bounds(plan: Plan):
    yield _heading(6, "Physical bounds (datasheet peaks: no configuration beats them)")
    if not plan.slo_findings:
        yield _para("no SLO given.")
    for f in plan.slo_findings:
        yield Text.assemble(("✓ " if f.ok else "✗ ", "green" if f.ok else "red"), f.text + ".")


# ---- 7 ----------------------------------------------------------------------------------------


def _points(r: CandidateResult) -> str:
    return " ".join(
        f"{p.rate:g}{'✓' if p.ok else '✗'}" for p in sorted(r.points, key=lambda p: p.rate)
    )


def _max_rate(r: CandidateResult) -> str:
    if r.best is not None:
        return f"{r.max_rate:g}"
    low = r.lowest
    return f"< {low.rate:g}" if low else "-"


def _search(plan: Plan):
    s = plan.request.settings
    yield _heading(7, "Topologies and flags, simulated")
    warm = (
        f"{s.warmup:g} s of warm-up"
        if s.warmup is not None
        else "a warm-up as long as the 99th-percentile request takes by the cost model "
        f"({s.min_warmup:g}-{s.max_warmup:g} s; it fills the fleet before measuring)"
    )
    yield _para(
        f"Every feasible split is simulated with its flags: open-loop arrivals at a rate, "
        f"{warm}, then a {s.window:g} s window (whole burst periods when the "
        f"workload has bursts), seed {s.seed}. The rate search starts near the cost model's "
        f"capacity estimate, steps by {STAGE1_GROW:g}x up or down until the SLO flips, then "
        "bisects until the "
        f"bracket is within {s.rel_tol:.0%}. Splits go most promising first; one that starts "
        "once a rate is known to hold starts at it and is dropped after one step down, and a "
        "split whose bracket falls below the best stops early. Variants start at the best rate."
    )
    yield _results_table("topologies (planner flags)", plan.topologies, plan)
    if plan.variants:
        yield _results_table(
            f"flag variants on {plan.topologies and plan.chosen.candidate.name}",
            plan.variants,
            plan,
        )
    yield from hosts(plan)
    yield from long_pool(plan)
    decide = (
        " The screening only orders the work: the long runs below decide."
        if plan.sustainability is not None
        else ""
    )
    yield Text.assemble(("screening choice: ", "bold"), plan.choice_reason + "." + decide)
    yield from sustainability(plan)
    yield from band(plan)
    if plan.frontier:
        t = Table(
            title="throughput / latency frontier (points no other point beats on all three)",
            title_justify="left",
            header_style="bold",
        )
        for c in ("configuration", "rate", "out tok/s", "TTFT", "ITL", "SLO"):
            t.add_column(c, justify="left" if c == "configuration" else "right")
        for p in plan.frontier:
            t.add_row(
                p.label,
                f"{p.rate:g}",
                f"{p.output_throughput:,.0f}",
                _s(p.ttft),
                _ms(p.itl),
                "✓" if p.slo_ok else "✗",
            )
        t.caption = f"TTFT and ITL at P{plan.request.slo.percentile:g}"
        yield t


def _results_table(title: str, results: list[CandidateResult], plan: Plan) -> Table:
    pct = f"P{plan.request.slo.percentile:g}"
    t = Table(title=title, title_justify="left", header_style="bold")
    for c in (
        "configuration",
        "flags",
        "policy",
        "rates simulated (req/s)",
        "max req/s",
        f"TTFT {pct}",
        f"ITL {pct}",
        "out tok/s",
    ):
        t.add_column(c, justify="right" if c.startswith(("max", "TTFT", "ITL", "out")) else "left")
    for r in results:
        b = r.best
        mark = " ◀" if r is plan.chosen else ""
        t.add_row(
            (r.candidate.name if r.candidate.variant == "planner flags" else r.candidate.variant)
            + mark,
            r.candidate.flags.label(),
            r.candidate.policy,
            _points(r) + (" (lower rates do not help)" if r.futile else ""),
            _max_rate(r),
            *_at(b or r.lowest, b is None),
        )
    t.caption = (
        "✓ SLO met, ✗ missed; latency and throughput at the highest rate that met the SLO, or "
        "(✗) at the lowest rate tried where none did"
    )
    return t


def _at(o: Outcome | None, missed: bool) -> tuple[str, str, str]:
    if o is None:
        return "-", "-", "-"
    mark = " ✗" if missed else ""
    return _s(o.ttft) + mark, _ms(o.itl) + mark, f"{o.summary.output_throughput:,.0f}" + mark


# ---- 8 ----------------------------------------------------------------------------------------


def _prediction(plan: Plan):
    p, dep, c = plan.point, plan.deployment, plan.chosen.candidate
    yield _heading(8, "Chosen configuration and its predicted performance")
    verified = (
        f", the worst of the verification's seeds ({p.seed})"
        if plan.sustainability is not None
        else ""
    )
    yield _para(
        f"{dep.replicas} replica(s) x TP={dep.tp} of {dep.model.name} in {dep.dtype} on "
        f"{dep.num_gpus} x {dep.gpu.name}, {c.flags.label()}, routed by {c.policy}; at "
        f"{p.rate:g} req/s (open loop: every arrival process of {plan.profile.name} scaled to "
        f"this total rate, the mix kept), simulated {p.duration:g} s of arrivals with the first "
        f"{p.warmup:g} s left out of the metrics{verified}:"
    )
    yield _prediction_table(plan, p)
    yield _para(f"SLO check: {p.why}.")
    t, i = plan.with_error(p)
    e = plan.model_error
    if t is not None:
        itl = "" if i is None else f", ITL P{plan.request.slo.percentile:g} up to {i * 1e3:.0f} ms"
        yield _para(
            f"With the twin's worst measured error in this regime (validated: {e.validated}; "
            f"docs/validation.md): TTFT P{plan.request.slo.percentile:g} up to {t:.2f} s{itl}."
        )
    yield _para(
        f"What these figures rest on: the engine model (docs/engine.md) with {rests_on(dep)}"
        + ("; the band of step 7 says how far they can move." if plan.band else ".")
    )
    yield _per_class(plan, p)
    b = plan.profile.burst
    period = b.period_at(p.rate, plan.profile.nominal_rate) if b else None
    if b is not None and period:
        ttfts = [p.per_class[c]["ttft"] for c in b.classes if c in p.per_class]
        worst = max((t for t in ttfts if t is not None), default=None)
        yield _para(
            f"bursts at this rate: {b.size} requests ({', '.join(b.classes)}; "
            f"{sum(b.prompt_tokens):,} prompt tokens) arrive together every {period:.4g} s; "
            f"the window holds {round((p.duration - p.warmup) / period)} of them"
            + (
                f", and their TTFT P{plan.request.slo.percentile:g} is {worst:.1f} s"
                if worst
                else ""
            )
            + "."
            + (
                " Requests that arrive behind a burst wait in the same first-come-first-served "
                "queues, so the bursts, more than the average load, set the rate the SLO allows."
                if worst and plan.request.slo.ttft and worst > plan.request.slo.ttft
                else ""
            )
        )
    yield _para(
        "req/s and out tok/s: requests finished and output tokens delivered inside the window ÷ "
        "its length; TTFT: first token − send; ITL: gaps between consecutive tokens; TPOT: "
        "(E2E − TTFT) ÷ (tokens − 1) per request; goodput: req/s that met TTFT and TPOT SLOs "
        "(docs/metrics.md). Peak KV: the fullest any replica's KV cache got.",
        "dim",
    )
    yield Text.assemble(("reproduce (prints the same row): ", "bold"), plan.simulate_command)


def _prediction_table(plan: Plan, p: Outcome) -> Table:
    s = p.summary
    dep = plan.deployment
    title = (
        f"{dep.model.name} on {dep.replicas} x TP={dep.tp} {dep.gpu.name} — {plan.workload.name}"
    )
    head = ["load", *LATENCY_HEAD, "re-prefill", "prefix hit", "peak KV"]
    row = [
        f"{p.rate:g} req/s",
        *latency_row(s),
        pct(s.recomputed_ratio),
        pct(p.prefix_hit_rate),
        pct(p.peak_kv_usage),
    ]
    return rich_table(TableData("prediction", title, head, [row], [""], WINDOW_NOTE))


def _per_class(plan: Plan, p: Outcome) -> Table:
    pct = f"P{plan.request.slo.percentile:g}"
    slo = plan.request.slo
    scope = slo.classes
    t = Table(title="per class", title_justify="left", header_style="bold")
    for c in ("class", "requests", f"TTFT {pct}", f"ITL {pct}", "its SLO"):
        t.add_column(c, justify="left" if c == "class" else "right")
    for name, d in p.per_class.items():
        if scope is None:
            verdict = "pooled"
        elif name not in scope:
            verdict = "not judged"
        else:
            lt, li = slo.limits_of(name)
            ok = d["ttft"] is not None and (lt is None or d["ttft"] <= lt)
            ok = ok and (li is None or (d["itl"] is not None and d["itl"] <= li))
            verdict = "met" if ok else "missed"
        t.add_row(name, f"{d['requests']:,}", _s(d["ttft"]), _ms(d["itl"]), verdict)
    t.caption = (
        "pooled: the SLO is judged over every request together"
        if scope is None
        else "each named class is judged on its own requests, under its own SLO"
    )
    return t


# ---- 9 - 11 -------------------------------------------------------------------------------------


def _gateway(plan: Plan):
    g = plan.gateway
    yield _heading(9, "Gateway")
    yield Text.assemble(("policy ", "bold"), (g.policy, "bold cyan"), f": {g.policy_reason}.")
    yield Text.assemble(
        ("max in flight per replica ", "bold"),
        (str(g.max_in_flight_per_replica), "bold cyan"),
        f": {g.cap_reason}.",
    )


def _capacity(plan: Plan):
    if plan.capacity is None and plan.cost is None:
        return
    yield _heading(10, "Capacity and cost")
    if plan.capacity is not None:
        c = plan.capacity
        yield _para(f"GPUs for {c.target_rate:g} req/s: {c.text}.")
        if c.verified is not None:
            yield Text.assemble(
                ("✓ " if c.verified else "✗ ", "green" if c.verified else "red"),
                c.verify_text
                + ("." if c.verified else " — linear scaling is optimistic here; add a replica."),
            )
    if plan.cost is not None:
        yield _para(f"this fleet: {plan.cost.text}.")
    if plan.target_cost is not None:
        yield _para(f"at the target: {plan.target_cost.text}.")


def _plausibility(plan: Plan):
    found = [
        *([plan.target_finding] if plan.target_finding else []),
        *plan.claim_findings,
        *plan.prediction_findings,
    ]
    yield _heading(11, "Plausibility (against the datasheet bounds)")
    for f in found:
        yield Text.assemble(
            ("✓ " if f.ok else "✗ implausible: ", "green" if f.ok else "bold red"), f.text + "."
        )


def _deploy(plan: Plan):
    yield _heading(12, "Deploy")
    yield _para(
        f"{len(plan.commands)} vLLM replica(s), each pinned to its GPUs with CUDA_VISIBLE_DEVICES; "
        f"the gateway listens on port {plan.fleet.gateway.port}:"
    )
    several = len({r.host for r in plan.fleet.replicas}) > 1
    for r, cmd in zip(plan.fleet.replicas, plan.commands, strict=True):
        yield Text((f"[{r.host}] " if several else "") + cmd, style="cyan")


def render_timing(plan: Plan) -> Text:
    text = (
        f"planned in {plan.wall_seconds:.1f} s: the search simulated {plan.points_simulated} "
        f"points in {plan.search_seconds:.1f} s with {plan.jobs} worker process(es) "
        f"({plan.simulation_cpu:.1f} s of CPU)"
    )
    if plan.capacity is not None:
        text += f", the target-rate check {plan.capacity_seconds:.1f} s"
    return Text(text, style="bold")


def render_group(plan: Plan) -> Group:
    return Group(*render_plan(plan), render_timing(plan))


__all__ = ["MemoryRow", "render_group", "render_plan", "render_timing"]
