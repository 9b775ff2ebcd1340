"""The planner: from "this model on these GPUs, this traffic, these SLOs" to a configuration,
its predicted performance (a simulated point ``servefleet simulate`` reproduces exactly), and
what to run.

Steps (each a module): profile the workload (``profile``) → precision (``precision``) → flags
per TP with reasons (``flags``) → memory per TP (``memory_table``) → physical bounds of the
request (``plausibility``) → simulate every feasible topology, then flag variants of the best
(``search``) → gateway policy and cap (``gateway``) → GPUs for a target rate, cost (``cost``) →
``fleet.yaml`` and ``vllm serve`` lines (``render``).

Impossible requests raise ``PlanImpossible`` with the reason and the arithmetic.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

from servefleet.client_protocol import SDK_CHAT, ClientProtocol
from servefleet.engine.memory import resolve_kv_dtype
from servefleet.hardware import GPUCatalog, GPUSpec
from servefleet.models import ModelSpec, load_model
from servefleet.sim.deployment import Deployment, resolve_deployment
from servefleet.stats import class_slos, find_knee, slo_classes_text
from servefleet.workload import WorkloadSpec

from . import plausibility as pl
from .band import UncertaintyBand, band_run, deployment_at
from .cost import Capacity, CostEstimate, cost_estimate, gpus_needed
from .flags import (
    Flags,
    GlobalFlags,
    Overrides,
    choose_flags,
    choose_global,
    default_flags,
)
from .fleet_yaml import Fleet
from .gateway import (
    GatewayChoice,
    alternative_policy,
    choose_cap,
    default_policy,
    pool_split,
)
from .impossible import below_bound, fits_nowhere, no_rate
from .longest import declared_longest
from .memory_table import MemoryRow, candidate_tps, memory_row, spanning_gpu, tp_problem
from .model_error import RegimeError, breaks_at, regime_error
from .precision import PrecisionChoice, QuantOption, choose_precision, quantization_options
from .probes import LongProbe, ShortProbe, seeds
from .profile import WorkloadProfile, load_any_workload, profile_workload
from .render import build_fleet, serve_commands
from .runner import Runner
from .search import (
    Candidate,
    CandidateResult,
    FrontierPoint,
    Outcome,
    SearchSettings,
    SLOTarget,
    Task,
    burst_limited_rate,
    choose_warmup,
    estimate_rate,
    frontier,
)
from .settle import settle_commands
from .sustainable import (
    Sustainability,
    fallback,
    finalists,
    long_search,
    pessimistic_check,
    verification,
    verified,
)

START_FRACTION = 0.6
"""The rate search starts at this fraction of the cost model's capacity estimate."""
BURST_START_FRACTION = 0.5
"""With bursts, the search starts at this fraction of ``burst_limited_rate``: that estimate
counts only the burst's own prefill, while the traffic queued behind it, and KV cache limits,
hold the fleet about as long again (seen on the enterprise-mix plans)."""
STAGE1_GROW = 1.5
"""Step of the topologies' rate search before bisecting (the start is an estimate, so the
answer is usually within one or two steps; a smaller step overshoots into cheaper points)."""
MAX_VERIFY_REPLICAS = 32
LONG_POOL_VARIANT = "long-prompt pool"


class PlanImpossible(Exception):
    """The request cannot be met; the message says why, with the arithmetic."""


@dataclass(frozen=True)
class PlanRequest:
    model: str = "Qwen1.5-14B"
    gpu: str = "V100-SXM2-32G"
    num_gpus: int = 8
    """GPUs per host."""
    hosts: int = 1
    gpu_file: str | None = None
    workload: str = "chat-3tier"
    workload_overrides: dict | None = None
    """Deep-merged into the workload (``--time-scale``, ``--max-requests``,
    ``--trace-block-size`` of a trace)."""
    slo: SLOTarget = field(default_factory=SLOTarget)
    target_rate: float | None = None
    gpu_price: float | None = None
    """Dollars per GPU-hour."""
    dtype: str = "auto"
    overrides: Overrides = field(default_factory=Overrides)
    policy: str | None = None
    """Gateway policy (None: chosen and simulated)."""
    claims: tuple[tuple[str, float], ...] = ()
    settings: SearchSettings = field(default_factory=SearchSettings)
    jobs: int | None = None
    variants: bool = True
    band: bool = True
    """Run the uncertainty band's corners (short screening searches)."""
    engine: str = "vllm"
    client: ClientProtocol = SDK_CHAT
    """How the clients stream (``--endpoint``, ``--client-protocol``)."""

    @property
    def total_gpus(self) -> int:
        return self.num_gpus * self.hosts


@dataclass
class Plan:
    request: PlanRequest
    model: ModelSpec
    gpu: GPUSpec
    workload: WorkloadSpec
    profile: WorkloadProfile
    precision: PrecisionChoice
    quantization: list[QuantOption]
    glob: GlobalFlags
    flags: Flags
    """The chosen flags, each with its reason (the simulation's, where a variant won)."""
    memory: list[MemoryRow]
    slo_findings: list[pl.Finding]
    topologies: list[CandidateResult]
    variants: list[CandidateResult]
    sustainability: Sustainability | None
    """The long runs: finalists, verification at fresh seeds, headroom (None: screening only)."""
    band: UncertaintyBand | None
    """The rate under the plausible range of the unmeasured figures, and whether the ranking
    of the chosen topology and the runner-up can flip."""
    settle: list[str]
    """When it can flip: the commands of the one measurement that settles it."""
    knee_rate: float | None
    """The knee (``stats.find_knee``, the one rule) of the chosen topology's screened rates."""
    chosen: CandidateResult
    """The chosen configuration's search: long points (or screening points without
    ``settings.sustain``)."""
    point: Outcome
    gateway: GatewayChoice
    frontier: list[FrontierPoint]
    capacity: Capacity | None
    cost: CostEstimate | None
    target_cost: CostEstimate | None
    target_finding: pl.Finding | None
    claim_findings: list[pl.Finding]
    prediction_findings: list[pl.Finding]
    fleet: Fleet
    commands: list[str]
    simulate_command: str
    model_error: RegimeError
    """The twin's measured error in the verified point's regime (``model_error``)."""
    breaks_with_error: float | None
    """Where the SLO breaks on the long runs once that error is added (None: no break seen)."""
    choice_reason: str
    stage_seconds: dict[str, float]
    """Wall seconds of each stage of the search (screening, variants, long runs, band)."""
    search_seconds: float
    """Topologies and flag variants (the search proper)."""
    capacity_seconds: float
    """The simulation of the fleet a target rate needs (0 without a target)."""
    wall_seconds: float
    points_simulated: int
    jobs: int

    @property
    def deployment(self) -> Deployment:
        return self.chosen.candidate.deployment

    @property
    def nominal_rate(self) -> float:
        """The rate verified with the engine model's figures at their nominal values."""
        return self.point.rate

    @property
    def recommended_point(self):
        """The point of the recommended rate: at the band's pessimistic corner when there is
        one that held, else the verified point."""
        p = self.band.pessimistic if self.band is not None else None
        held = p.held if p is not None else None
        return held if held is not None else self.point

    def with_error(self, o=None) -> tuple[float | None, float | None]:
        """(TTFT, ITL) of point ``o`` (the recommended one) with the twin's error added."""
        o = o or self.recommended_point
        e = self.model_error
        return (
            None if o.ttft is None else o.ttft * e.ttft_factor,
            None if o.itl is None else o.itl * e.itl_factor,
        )

    @property
    def recommended_rate(self) -> float | None:
        """The rate to operate at: the one that held at the pessimistic end of the band (the
        nominal one where there is no band; None where no rate held there)."""
        p = self.band.pessimistic if self.band is not None else None
        return self.nominal_rate if p is None else p.rate

    @property
    def simulation_cpu(self) -> float:
        """CPU seconds of every simulated point (in the worker processes)."""
        cpu = sum(p.cpu for r in self.topologies + self.variants for p in r.points)
        if self.band is not None:
            cpu += sum(
                p.cpu for tb in self.band.topologies for r in tb.corners.values() for p in r.points
            )
            check = self.band.pessimistic
            if check is not None and check.result is not None:
                cpu += sum(p.cpu for p in check.result.points)
        if self.sustainability is not None:
            sus = self.sustainability
            cpu += sum(p.cpu for r in sus.results for p in r.points)
            cpu += sum(a.cpu for x in (sus, *sus.rejected) for a in x.attempts)
        return cpu


Callback = Callable[..., None]


@dataclass
class Hooks:
    """Progress callbacks (both optional): ``stage(name, candidates)`` when a stage starts,
    ``point(label, outcome)`` after every simulated point."""

    stage: Callback | None = None
    point: Callback | None = None

    def on_stage(self, name: str, total: int) -> None:
        if self.stage:
            self.stage(name, total)


def load_gpu(req: PlanRequest) -> GPUSpec:
    catalog = GPUCatalog.builtin()
    if req.gpu_file:
        catalog = catalog.with_yaml(req.gpu_file)
    return catalog.get(req.gpu)


def check_request(req: PlanRequest) -> None:
    """Bad input at the edge: a clear ValueError naming the option."""
    if req.num_gpus < 1 or req.hosts < 1:
        raise ValueError("--num-gpus and --hosts must be >= 1")
    slo = req.slo
    for name, v in (("--slo-ttft", slo.ttft), ("--slo-itl", slo.itl)):
        if v is not None and not v > 0:
            raise ValueError(f"{name} must be > 0 seconds, got {v}")
    if not 0 < slo.percentile <= 100:
        raise ValueError(f"--slo-percentile must be in (0, 100], got {slo.percentile}")
    if req.target_rate is not None and not req.target_rate > 0:
        raise ValueError(f"--target-rate must be > 0 req/s, got {req.target_rate}")
    if req.gpu_price is not None and not req.gpu_price > 0:
        raise ValueError(f"--gpu-price must be > 0 $/GPU-hour, got {req.gpu_price}")
    s = req.settings
    if (s.warmup is not None and not s.warmup >= 0) or not s.window > 0:
        raise ValueError("--window must be > 0 and --warmup >= 0 seconds")
    if not 0 < s.rel_tol < 1:
        raise ValueError(f"--rel-tol must be in (0, 1), got {s.rel_tol}")
    resolve_kv_dtype(req.overrides.kv_cache_dtype, "fp16", load_gpu(req))  # a clear error
    if req.jobs is not None and req.jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {req.jobs}")
    for key, _ in req.claims:
        if key not in pl.CLAIM_KEYS:
            raise ValueError(f"unknown claim {key!r}; use one of {', '.join(pl.CLAIM_KEYS)}")


def deployment_for(
    model: ModelSpec,
    gpu: GPUSpec,
    dtype: str,
    tp: int,
    replicas: int,
    flags: Flags,
    client: ClientProtocol = SDK_CHAT,
) -> Deployment:
    return resolve_deployment(
        model,
        gpu,
        tp=tp,
        replicas=replicas,
        dtype=dtype,
        max_model_len=flags.max_model_len,
        max_num_seqs=flags.max_num_seqs,
        max_num_batched_tokens=flags.max_num_batched_tokens,
        gpu_memory_utilization=flags.gpu_memory_utilization,
        block_size=flags.block_size,
        enable_prefix_caching=flags.enable_prefix_caching,
        enforce_eager=flags.enforce_eager,
        kv_cache_dtype=flags.kv_cache_dtype,
        client=client,
    )


def make_plan(req: PlanRequest, hooks: Hooks | None = None) -> Plan:
    t_start = time.perf_counter()
    hooks = hooks or Hooks()
    check_request(req)
    model = load_model(req.model)
    gpu = load_gpu(req)
    workload = load_any_workload(req.workload, req.workload_overrides)
    profile = profile_workload(workload, seed=req.settings.seed)
    _check_classes(req.slo, profile)
    req = replace(req, slo=_with_workload_slos(req.slo, workload))
    precision = choose_precision(model, gpu, req.dtype)
    dtype = precision.dtype
    glob = choose_global(model, profile, declared_longest(workload, profile), req.overrides)
    if glob.problem:
        raise PlanImpossible(glob.problem)

    rows = _memory_rows(req, model, gpu, dtype, profile, glob)
    feasible = [r for r in rows if r.feasible]
    if not feasible:
        raise PlanImpossible(fits_nowhere(req, model, gpu, dtype, rows))
    max_tp = max(r.tp for r in feasible)
    phys = pl.Physics(model, gpu, dtype)
    slo_findings = pl.check_slo(
        phys,
        profile,
        max_tp,
        req.total_gpus,
        req.slo.ttft,
        req.slo.itl,
        req.slo.percentile,
        req.slo.classes,
    )
    if bad := [f for f in slo_findings if not f.ok]:
        raise PlanImpossible(below_bound(req, gpu, bad))

    t_search = time.perf_counter()
    stages: dict[str, float] = {}
    t_stage = [t_search]

    def lap(name: str) -> None:
        now = time.perf_counter()
        stages[name] = now - t_stage[0]
        t_stage[0] = now

    settings = req.settings
    tol = settings.rel_tol
    with Runner(workload, profile, req.slo, settings, req.jobs) as runner:
        short = ShortProbe(profile, settings, req.slo)
        tasks = [_topology_task(req, model, gpu, dtype, profile, r) for r in feasible]
        hooks.on_stage(f"{len(tasks)} topologies", len(tasks))  # "TP x replicas" splits
        tasks.sort(key=lambda t: -t.start)  # the most promising first: it sets the bar
        stage1 = runner.run(tasks, short, prune=True, seed=True, on_point=hooks.point)
        stage1.sort(key=lambda r: r.candidate.deployment.tp)
        met = [r for r in stage1 if r.best is not None and not spans_hosts(req, r)]
        if not met:
            raise PlanImpossible(no_rate(req, stage1, settings.lowest_rate(profile)))
        best1, choice_reason = pick_topology(met, tol)
        lap("screening")
        vtasks = _variant_tasks(req, profile, best1) if req.variants else []
        if vtasks:
            hooks.on_stage(f"{len(vtasks)} flag variant(s) of {best1.candidate.name}", len(vtasks))
        stage2 = runner.run(vtasks, short, on_point=hooks.point)
        screened = chosen_of(best1, stage2)
        lap("variants")
        if screened is not best1:
            choice_reason += (
                f"; then {screened.candidate.variant} held {screened.max_rate:g} req/s, more "
                f"than the planner's flags ({best1.max_rate:g})"
            )
        elif stage2:
            choice_reason += "; no flag variant held more than the planner's flags"
        ctx = _Stage(req, runner, profile, short, stage1 + stage2, hooks)
        sustained, chosen, band, pair = ctx.sustain(stage1, screened, lap)
        if band is not None and sustained is not None:
            hooks.on_stage("the recommended rate at the pessimistic end of the band", 1)
            band.pessimistic = pessimistic_check(
                runner, sustained, band, profile, req.slo, hooks.point
            )
            if band.pessimistic is not None and (shown := band.pessimistic.shown) is not None:
                corner = replace(
                    chosen.candidate,
                    deployment=deployment_at(chosen.candidate.deployment, band.pessimistic.values),
                )
                band.pessimistic.simulate_command = simulate_command(
                    req, corner, shown.worst, band.pessimistic.values
                )
        chosen_screen = _screening_of(chosen, stage1 + stage2)
        lap("verification and band")
        search_seconds = time.perf_counter() - t_search
        point = sustained.verified.worst if sustained is not None else chosen.best
        assert point is not None
        t_capacity = time.perf_counter()
        capacity = _capacity(req, runner, chosen.candidate, point, profile)
        capacity_seconds = time.perf_counter() - t_capacity
        jobs = runner.jobs
    dep = chosen.candidate.deployment
    screened = chosen_screen  # the long stage may have picked another topology
    bursty = profile.burst is not None and profile.burst.period is not None
    twin_error = regime_error(point.max_in_flight, dep.tp, dep.dtype, bursty)
    breaks_with_error = None
    if sustained is not None:
        long_points = [*chosen.points, *sustained.attempts]
        breaks_with_error = breaks_at(long_points, req.slo.limits_of, twin_error)

    gateway = _gateway(req, profile, screened, point, stage2, best1)
    cost = target_cost = None
    if req.gpu_price is not None:
        s = point.summary
        cost = cost_estimate(dep.num_gpus, req.gpu_price, s.output_throughput, s.total_throughput)
        if capacity is not None:
            f = req.target_rate / point.rate
            target_cost = cost_estimate(
                capacity.gpus, req.gpu_price, s.output_throughput * f, s.total_throughput * f
            )
    target_finding = (
        pl.check_target(phys, profile, req.target_rate, req.total_gpus) if req.target_rate else None
    )
    claims = pl.check_claims(phys, profile, dict(req.claims), max_tp, req.total_gpus)
    predicted = pl.check_prediction(
        phys, profile, dep.tp, dep.num_gpus, point.summary.itl.p50, point.summary.output_throughput
    )
    fleet = build_fleet(
        dep,
        req.model,
        precision,
        req.num_gpus,
        req.hosts,
        gateway.policy,
        gateway.max_in_flight_per_replica,
        engine=req.engine,
        long_replicas=chosen.candidate.long_replicas,
        gpu_file=req.gpu_file,
    )
    return Plan(
        request=req,
        model=model,
        gpu=gpu,
        workload=workload,
        profile=profile,
        precision=precision,
        quantization=quantization_options(model, gpu, dep.tp, dtype),
        glob=glob,
        flags=explain_choice(screened, best1),
        memory=rows,
        slo_findings=slo_findings,
        topologies=stage1,
        variants=stage2,
        sustainability=sustained,
        band=band,
        settle=_settle(req, fleet, band, pair),
        knee_rate=knee_rate(screened),
        chosen=chosen,
        point=point,
        gateway=gateway,
        frontier=frontier(stage1 + stage2 + (sustained.results if sustained else [])),
        capacity=capacity,
        cost=cost,
        target_cost=target_cost,
        target_finding=target_finding,
        claim_findings=claims,
        prediction_findings=predicted,
        fleet=fleet,
        commands=serve_commands(fleet),
        simulate_command=simulate_command(req, chosen.candidate, point),
        model_error=twin_error,
        breaks_with_error=breaks_with_error,
        choice_reason=choice_reason,
        stage_seconds=stages,
        search_seconds=search_seconds,
        capacity_seconds=capacity_seconds,
        wall_seconds=time.perf_counter() - t_start,
        points_simulated=points_simulated(stage1 + stage2, sustained, band),
        jobs=jobs,
    )


def knee_rate(r: CandidateResult) -> float | None:
    """The knee of a candidate's screened rates, a rate sweep (docs/metrics.md "Knee")."""
    pts = sorted((p for p in r.points if p.stopped_at is None), key=lambda p: p.rate)
    i = find_knee(
        [p.rate for p in pts],
        [p.summary.output_throughput for p in pts],
        [p.summary.ttft.p95 for p in pts],
    )
    return None if i is None else pts[i].rate


@dataclass
class _Stage:
    """What the verification and the band need from the search so far."""

    req: PlanRequest
    runner: Runner
    profile: WorkloadProfile
    short: ShortProbe
    screened: list[CandidateResult]
    hooks: Hooks
    band_done: UncertaintyBand | None = None

    @property
    def deployable(self) -> list[CandidateResult]:
        return [r for r in self.screened if not spans_hosts(self.req, r)]

    def sustain(self, stage1, screened: CandidateResult, lap):
        """(sustainability or None, the chosen result, the band, the band's pair of
        (screening, sustainable rate) of the chosen and the runner-up): the finalists' long runs,
        the verification at fresh seeds (with the band's corners), and the fallback to the
        next finalist when no step of the verification holds (``sustainable``)."""
        req, runner, profile = self.req, self.runner, self.profile
        sustained, chosen, finals = None, screened, []
        if req.settings.sustain:
            finals = finalists([r for r in stage1 if not spans_hosts(req, r)], screened)
            self.hooks.on_stage(f"{len(finals)} finalist(s) on long runs", len(finals))
            pick = partial(pick_sustained, slo=req.slo)
            sustained = long_search(runner, profile, req.slo, finals, pick, self.hooks.point)
            if sustained.chosen.best is None:
                lowest = req.settings.lowest_rate(profile)
                raise PlanImpossible(no_rate(req, sustained.results, lowest))
            chosen = sustained.chosen
            lap("long runs")
        pair, band = self.verify_and_band(sustained, chosen)
        rejected: list[Sustainability] = []
        searched = sustained.results if sustained is not None else []
        tried = {chosen.candidate.label}
        while sustained is not None and not sustained.ok:
            nxt = fallback(runner, profile, req.slo, finals, searched, tried, self.hooks.point)
            if nxt is None:
                break
            rejected.append(sustained)
            sustained, chosen = nxt, nxt.chosen
            pair, band = self.verify_and_band(sustained, chosen, band_again=True)
        if sustained is not None and rejected:
            sustained.rejected = rejected
            mine = sustained.chosen.candidate.label
            others = [r for r in searched if r.candidate.label != mine]
            sustained.results = [sustained.chosen, *others]
        return sustained, chosen, band, pair

    def verify_and_band(self, sus: Sustainability | None, chosen, band_again: bool = False):
        """Verify ``sus`` at fresh seeds and screen the band's corners, in one run of the
        workers; after a fallback (``band_again``) the band follows the new choice."""
        req, tol = self.req, self.req.settings.rel_tol
        chosen_screen = _screening_of(chosen, self.screened)
        pair = _band_pair(sus, chosen, chosen_screen, self.deployable)
        want_band = req.band and (self.band_done is None or band_again)
        brun = band_run(self.profile, tol, *pair) if want_band else None
        tasks, probes = [], []
        if sus is not None:
            task, probe = verification(sus, self.profile, req.slo, req.settings)
            tasks, probes = [task], [probe]
        if brun is not None:
            tasks += brun.tasks
            probes += [self.short] * len(brun.tasks)
        if tasks:
            self.hooks.on_stage("verification at fresh seeds and the band's corners", len(tasks))
        results = self.runner.run(tasks, probes, on_point=self.hooks.point)
        if sus is not None:
            verified(sus, results.pop(0))
            pair = _band_pair(sus, chosen, chosen_screen, self.deployable)
        band = brun.fill(results) if brun is not None else self.band_done
        if band is not None:
            band.chosen.level = pair[0][1]
        self.band_done = band
        return pair, band


def _screening_of(r: CandidateResult, screened: list[CandidateResult]) -> CandidateResult:
    return next(s for s in screened if s.candidate is r.candidate)


def _band_pair(sus: Sustainability | None, chosen, chosen_screen, screened):
    """((chosen's screening, its sustainable rate), (runner-up's, its rate) or None): the
    runner-up is the best other finalist of the long runs (or of the screening)."""
    if sus is None:
        others = [r for r in screened if r.best is not None and r is not chosen_screen]
        others = [r for r in others if r.candidate.variant == "planner flags"]
        best = max(others, key=_rank, default=None)
        runner = (best, best.max_rate) if best is not None else None
        return (chosen_screen, chosen_screen.max_rate), runner
    others = [r for r in sus.results if r is not chosen and r.best is not None]
    best = max(others, key=_rank, default=None)
    runner = (_screening_of(best, screened), best.max_rate) if best is not None else None
    return (chosen_screen, sus.rate if sus.attempts else chosen.max_rate), runner


def _settle(req: PlanRequest, fleet: Fleet, band: UncertaintyBand | None, pair) -> list[str]:
    if band is None or not band.can_flip or pair[1] is None:
        return []
    deps = [(r.candidate.deployment, rate) for r, rate in pair]
    return settle_commands(fleet, deps, req.workload, req.slo)


def points_simulated(
    screening: list[CandidateResult], sus: Sustainability | None, band: UncertaintyBand | None
) -> int:
    """Simulated points: one per screening rate, one per seed of every long rate."""
    n = sum(len(r.points) for r in screening)
    if band is not None:
        n += sum(len(r.points) for tb in band.topologies for r in tb.corners.values())
        if band.pessimistic is not None and band.pessimistic.result is not None:
            n += sum(len(p.outcomes) for p in band.pessimistic.result.points)
    if sus is not None:
        n += sum(len(p.outcomes) for r in sus.results for p in r.points)
        n += sum(len(a.outcomes) for x in (sus, *sus.rejected) for a in x.attempts)
    return n


def _rank(r: CandidateResult):
    b = r.best
    return (r.max_rate, -(b.itl or 0.0), -(b.ttft or 0.0))


def _shown(v) -> str:
    return (
        ("on" if v else "off")
        if isinstance(v, bool)
        else f"{v:,}"
        if isinstance(v, int)
        else f"{v:g}"
    )


def explain_choice(chosen: CandidateResult, best1: CandidateResult) -> Flags:
    """The chosen flags; where a variant won, its flags' reasons say so, with the rule's."""
    new = chosen.candidate.flags
    if chosen is best1 or chosen.candidate.variant == "planner flags":
        return new
    old = best1.candidate.flags
    ov, nv = old.values(), new.values()
    reasons = []
    for key, why in new.reasons:
        if ov.get(key) != nv.get(key):
            why = (
                f"{_shown(nv[key])}, from the variant “{chosen.candidate.variant}”, chosen by "
                f"simulation: it sustains {chosen.max_rate:g} req/s where the rule's "
                f"{_shown(ov[key])} sustains {best1.max_rate:g}. The rule said: {old.reason(key)}"
            )
        reasons.append((key, why))
    return replace(new, reasons=tuple(reasons))


def chosen_of(best1: CandidateResult, variants: list[CandidateResult]) -> CandidateResult:
    """A flag variant replaces the planner's flags only if it sustains a higher rate."""
    better = [r for r in variants if r.best is not None and r.max_rate > best1.max_rate]
    return max(better, key=_rank) if better else best1


def pick_topology(met: list[CandidateResult], rel_tol: float) -> tuple[CandidateResult, str]:
    """The topology that sustains the highest rate; those within the search's resolution
    (``rel_tol``) of it count as tied, and among them the one with more replicas wins (losing
    one replica then loses a smaller share of the fleet)."""
    top = max(met, key=_rank)
    tied = [r for r in met if r.max_rate * (1 + rel_tol) >= top.max_rate]
    best = max(tied, key=lambda r: (r.candidate.deployment.replicas, _rank(r)))
    why = f"{best.candidate.name} sustains {best.max_rate:g} req/s under the SLO"
    others = [r for r in tied if r is not best]
    if others:
        why += (
            " — tied within the search's resolution ("
            + f"{rel_tol:.0%}) with "
            + ", ".join(f"{r.candidate.name} ({r.max_rate:g})" for r in others)
            + f"; with {best.candidate.deployment.replicas} replicas, losing one costs "
            f"{1 / best.candidate.deployment.replicas:.0%} of the capacity"
        )
    rest = [r for r in met if r not in tied]
    if rest:
        runner = max(rest, key=_rank)
        why += f"; next best {runner.candidate.name} at {runner.max_rate:g} req/s"
    return best, why


def headroom_of(o, slo: SLOTarget) -> float:
    """How far a point's latencies stay below their limits: 1 − the larger of TTFT ÷ its limit
    and ITL ÷ its limit (of the class ``_scoped`` judged; 0 at the limit)."""
    lt, li = slo.limits_of(o.slo_class)
    used = [v / lim for v, lim in ((o.ttft, lt), (o.itl, li)) if v is not None and lim]
    return 1.0 - max(used, default=1.0)


def pick_sustained(held: list[CandidateResult], slo: SLOTarget) -> tuple[CandidateResult, str]:
    """The long runs decide (the screening only ordered the work): the finalist whose long-run
    sustainable rate is highest wins; between equal rates, the one with more latency headroom
    there (``headroom_of``)."""

    def key(r: CandidateResult):
        return (r.max_rate, headroom_of(r.best, slo))

    best = max(held, key=key)
    why = f"{best.candidate.name} sustains {best.max_rate:g} req/s on long runs, the highest"
    equal = [r for r in held if r is not best and r.max_rate == best.max_rate]
    if equal:
        why += (
            "; as much as "
            + ", ".join(r.candidate.name for r in equal)
            + f", with more latency headroom there ({headroom_of(best.best, slo):.0%} vs "
            + ", ".join(f"{headroom_of(r.best, slo):.0%}" for r in equal)
            + ")"
        )
    rest = sorted((r for r in held if r is not best and r not in equal), key=key, reverse=True)
    if rest:
        why += "; then " + ", ".join(f"{r.candidate.name} ({r.max_rate:g})" for r in rest)
    return best, why


def _with_workload_slos(slo: SLOTarget, workload) -> SLOTarget:
    """``slo`` with the SLO values the workload spec gives its classes (``classes.<name>.slo``)
    where ``--slo-classes`` gave none: what ``servefleet simulate`` applies too."""
    own = class_slos(workload.model_dump(mode="json"), slo.stats_slo())
    given = {n for n, _, _ in slo.limits}
    extra = tuple((n, s.ttft, s.itl) for n, s in sorted(own.items()) if n not in given)
    return replace(slo, limits=slo.limits + extra) if extra else slo


def _check_classes(slo: SLOTarget, profile: WorkloadProfile) -> None:
    if slo.classes is None:
        return
    known = {c.name for c in profile.classes}
    if unknown := sorted(slo.classes - known):
        raise ValueError(
            f"--slo-classes names {unknown}, not classes of {profile.name}: {', '.join(sorted(known))}"
        )


def _memory_rows(req, model, gpu, dtype, profile, glob) -> list[MemoryRow]:
    rows = []
    for tp in candidate_tps(req.num_gpus, req.hosts):
        replicas = req.total_gpus // tp
        g = gpu if tp <= req.num_gpus else spanning_gpu(gpu)
        flags = None
        if tp_problem(model, tp) is None:
            flags = choose_flags(model, g, dtype, tp, profile, glob, req.overrides, req.slo.itl)
        rows.append(
            memory_row(model, g, dtype, tp, replicas, flags, glob.max_model_len, profile.mean_total)
        )
    return rows


def spans_hosts(req: PlanRequest, r: CandidateResult) -> bool:
    """A replica larger than a host: its all-reduces cross the network. Simulated and shown
    for that cost; not chosen (``fleet.yaml`` and ``servefleet up`` run a replica on one host;
    vLLM would need a Ray cluster across the hosts)."""
    return r.candidate.deployment.tp > req.num_gpus


def _topology_task(req, model, gpu, dtype, profile, row: MemoryRow) -> Task:
    flags = row.flags
    spans = row.tp > req.num_gpus
    g = spanning_gpu(gpu) if spans else gpu
    dep = deployment_for(model, g, dtype, row.tp, row.replicas, flags, req.client)
    policy = req.policy or default_policy(profile, flags.enable_prefix_caching, row.replicas)[0]
    warmup = choose_warmup(dep, profile, req.settings)
    name = f"{row.replicas} x TP={row.tp}" + (
        f" over {row.tp // req.num_gpus} hosts" if spans else ""
    )
    cand = Candidate(name, "planner flags", dep, flags, policy, warmup)
    start = START_FRACTION * estimate_rate(dep, profile)
    if (burst := burst_limited_rate(dep, profile, req.slo)) is not None:
        start = min(start, BURST_START_FRACTION * burst)
    return Task(cand, start, STAGE1_GROW)


def _fits(dep: Deployment) -> bool:
    mem = dep.memory()
    return mem.fits and mem.kv_tokens >= dep.max_model_len


def _variant_tasks(req: PlanRequest, profile: WorkloadProfile, best: CandidateResult) -> list[Task]:
    """A few alternatives to the planner's flags on the best topology: vLLM's defaults, the
    other routing policy (when there are sessions or shared prefixes to keep together), and a
    long-prompt pool (when the workload has a long class: ``gateway.pool_policy``)."""
    c = best.candidate
    gpu, flags, dep = c.deployment.gpu, c.flags, c.deployment
    variants: list[tuple[str, Flags, str]] = []
    defaults = default_flags(gpu, flags)
    if defaults.values() != flags.values():
        variants.append(("vLLM defaults", defaults, c.policy))
    shared = profile.shared_fraction(flags.block_size) > 0
    if req.policy is None and dep.replicas > 1 and (shared or profile.has_sessions):
        alt = alternative_policy(c.policy)
        variants.append((f"policy {alt}", flags, alt))
    split = pool_split(profile, dep.replicas, c.policy) if req.policy is None else None
    if split is not None:
        variants.append((LONG_POOL_VARIANT, flags, split.policy))
    # A variant matters only if it holds where the rules' flags missed: it starts at the
    # lowest rate they missed and is dropped if it misses there too.
    factor = 1 + req.settings.rel_tol
    missed = [p.rate for p in best.points if not p.ok and p.rate > best.max_rate]
    start = min(missed) if missed else best.max_rate * factor
    tasks = []
    for name, f, policy in variants:
        d = deployment_for(dep.model, gpu, dep.dtype, dep.tp, dep.replicas, f, dep.client)
        if _fits(d):
            long = split.long_replicas if name == LONG_POOL_VARIANT and split else 0
            warm = choose_warmup(d, profile, req.settings)
            cand = Candidate(c.name, name, d, f, policy, warm, long)
            # the pool split starts where one pool holds: the two compare at the same rate
            first = best.max_rate if name == LONG_POOL_VARIANT else start
            tasks.append(Task(cand, first, factor, max_down=0, accelerate=True))
    return tasks


def _gateway(req, profile, chosen, point, stage2, best1) -> GatewayChoice:
    policy = chosen.candidate.policy
    dep = chosen.candidate.deployment
    if req.policy is not None:
        why = "set by you"
    else:
        why = default_policy(profile, dep.enable_prefix_caching, dep.replicas)[1]
        if chosen.candidate.variant == LONG_POOL_VARIANT:
            why = pool_split(profile, dep.replicas, best1.candidate.policy).reason + (
                f"; simulated: it holds {chosen.max_rate:g} req/s vs {best1.max_rate:g} with one "
                "pool (screening)"
            )
        elif chosen.candidate.variant.startswith("policy "):
            why = (
                f"simulated: it holds {chosen.max_rate:g} req/s vs {best1.max_rate:g} with "
                f"{best1.candidate.policy} (screening)"
            )
        elif chosen is best1:
            alt = [r for r in stage2 if r.candidate.variant.startswith("policy ")]
            if alt:
                why += f" (simulated {alt[0].candidate.policy}: {alt[0].max_rate:g} req/s)"
    cap, cap_why = choose_cap(point.max_in_flight, point.rate, dep.replicas)
    return GatewayChoice(policy, why, cap, cap_why)


def _capacity(req, runner: Runner, c: Candidate, point, profile) -> Capacity | None:
    """GPUs for ``--target-rate`` by linear scaling of the printed (verified) rate, then that
    fleet simulated at the target (on a long run, when the plan judges sustainability)."""
    if req.target_rate is None:
        return None
    dep = c.deployment
    cap = gpus_needed(req.target_rate, point.rate, dep.replicas, dep.tp, req.total_gpus)
    if cap.replicas > MAX_VERIFY_REPLICAS:
        return cap
    long = 0
    if c.long_replicas:  # the long pool keeps its share of the replicas
        long = min(cap.replicas - 1, max(1, round(c.long_replicas * cap.replicas / dep.replicas)))
    cand = replace(
        c,
        name=f"{cap.replicas} x TP={dep.tp}",
        variant="target",
        deployment=dep.with_(replicas=cap.replicas),
        long_replicas=long if cap.replicas > 1 else 0,
    )
    s = req.settings
    timing = {cand.label: (max(s.long_window, point.duration - point.warmup), point.warmup)}
    probe = (
        LongProbe(profile, s, req.slo, timing, seeds(s.seed, s.verify_seeds[:1]))
        if s.sustain
        else ShortProbe(profile, s, req.slo)
    )
    o = runner.judge(probe, cand, req.target_rate)
    text = f"simulated {cap.replicas} x TP={dep.tp} at {req.target_rate:g} req/s: {o.why}"
    return Capacity(
        cap.target_rate,
        cap.rate_per_replica,
        cap.replicas,
        cap.gpus,
        cap.available_gpus,
        cap.text,
        o.ok,
        text,
    )


def simulate_command(
    req: PlanRequest, cand: Candidate, point: Outcome, params: dict[str, float] | None = None
) -> str:
    """The `servefleet simulate` line that reproduces the chosen point exactly (``params``:
    the GPU's banded figures at a corner of the band, as ``--gpu-param``)."""
    d = cand.deployment
    workload = req.workload
    if Path(workload).suffix == ".jsonl" or workload.startswith("trace:") or req.workload_overrides:
        workload = "workload.yaml"  # written next to plan.json (a trace: {path: ...} file)
    args = [
        "servefleet simulate",
        f"--model {shlex.quote(req.model)}",
        f"--gpu {shlex.quote(d.gpu.name)}",
        f"--num-gpus {d.num_gpus}",
        f"--tp {d.tp}",
        f"--replicas {d.replicas}",
        f"--dtype {d.dtype}",
        f"--max-model-len {d.max_model_len}",
        f"--max-num-seqs {d.max_num_seqs}",
        f"--max-num-batched-tokens {d.max_num_batched_tokens}",
        f"--gpu-memory-utilization {d.gpu_memory_utilization:g}",
        f"--block-size {d.block_size}",
        *([f"--kv-cache-dtype {k}"] if (k := req.overrides.kv_cache_dtype) != "auto" else []),
        "--enable-prefix-caching" if d.enable_prefix_caching else "--no-enable-prefix-caching",
        f"--workload {shlex.quote(workload)}",
        f"--rate {point.rate:g}",
        f"--duration {point.duration:g}",
        f"--warmup {point.warmup:g}",
        f"--seed {point.seed}",
        f"--policy {cand.policy}",
    ]
    if cand.long_replicas:
        args.append(f"--long-replicas {cand.long_replicas}")
    if d.client != SDK_CHAT:
        args += [f"--endpoint {d.client.endpoint}", f"--client-protocol {d.client.stream_options}"]
    if req.gpu_file:
        args.append(f"--gpu-file {shlex.quote(req.gpu_file)}")
    if req.slo.ttft is not None:
        args.append(f"--slo-ttft {req.slo.ttft:g}")
    if req.slo.itl is not None:
        args.append(f"--slo-itl {req.slo.itl:g}")
    if (named := req.slo.slo_classes()) is not None:
        text = slo_classes_text(named, req.slo.stats_slo())
        args.append(f"--slo-classes {shlex.quote(text)}")
    for name, value in sorted((params or {}).items()):
        args.append(f"--gpu-param {name}={value!r}")
    return " ".join(args)
