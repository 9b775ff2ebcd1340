"""A simulated benchmark point, and sweeps of them: the virtual world's `bench`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from servefleet.records import RequestRecord
from servefleet.routing import make_policy
from servefleet.routing.pools import DEFAULT_POOL, LONG_POOL
from servefleet.sim.cluster import ClusterSim, SharedGPU, SimReplica
from servefleet.sim.deployment import Deployment
from servefleet.stats import SLO, Summary, Window, summarize
from servefleet.workload import WorkloadSpec, build_source
from servefleet.workload.types import Load

__all__ = ["Load", "PointResult", "build_replicas", "simulate_point", "sweep"]


@dataclass(slots=True)
class PointResult:
    load: Load
    records: list[RequestRecord]
    summary: Summary
    replicas: list[SimReplica]
    peak_kv_usage: float
    prefix_hit_rate: float | None
    """Prefix-cache hits ÷ queried tokens, summed over replicas (vLLM's definition)."""
    stopped_at: float | None = None
    """When the run gave up early (``stop_waiting``); None: it ran to the end."""


def build_replicas(dep: Deployment, long_replicas: int = 0) -> list[SimReplica]:
    """The deployment's replicas; with ``replicas_per_gpu`` > 1, consecutive replicas share
    a GPU (as ``servefleet up`` places them). The last ``long_replicas`` form the ``long``
    pool (the length-pools policies send long prompts there)."""
    k = dep.replicas_per_gpu
    switch = dep.cost_model().eff.gpu_share_switch_s
    gpus = [SharedGPU(switch) if k > 1 else None for _ in range(-(-dep.replicas // k))]
    first_long = dep.replicas - long_replicas
    return [
        SimReplica(
            f"replica-{i}",
            dep.build_engine(),
            pool=LONG_POOL if i >= first_long else DEFAULT_POOL,
            gpu=gpus[i // k],
        )
        for i in range(dep.replicas)
    ]


def simulate_point(
    dep: Deployment,
    workload: WorkloadSpec,
    load: Load,
    *,
    duration: float,
    warmup: float,
    seed: int = 0,
    policy: str = "least-outstanding",
    slo: SLO | None = None,
    class_slos: dict[str, SLO] | None = None,
    stop_waiting: int | None = None,
    long_replicas: int = 0,
) -> PointResult:
    """One point. ``stop_waiting``: stop early once more requests than this wait for their
    first token (``ClusterSim.run``); the result then says when (``stopped_at``).
    ``long_replicas``: the last replicas form the ``long`` pool (``build_replicas``)."""
    if not 0 <= warmup < duration:
        raise ValueError(f"warm-up ({warmup} s) must be shorter than the duration ({duration} s)")
    source = build_source(workload, seed=seed, rate=load.rate, concurrency=load.concurrency)
    if not 0 <= long_replicas < dep.replicas or (long_replicas and dep.replicas < 2):
        raise ValueError(
            f"--long-replicas must leave at least one of the {dep.replicas} replicas to the "
            f"default pool, got {long_replicas}"
        )
    replicas = build_replicas(dep, long_replicas)
    result = ClusterSim(replicas, make_policy(policy), source, dep.answers).run(
        duration, stop_waiting=stop_waiting
    )
    summary = summarize(result.records, Window(warmup, duration), slo, class_slos=class_slos)
    peak = max((max(r.log.kv_usage, default=0.0) for r in replicas), default=0.0)
    q = sum(r.engine.scheduler.kv.stats.queries for r in replicas)
    h = sum(r.engine.scheduler.kv.stats.hits for r in replicas)
    hit = h / q if q else None
    return PointResult(load, result.records, summary, replicas, peak, hit, result.stopped_at)


def sweep(
    dep: Deployment,
    workload: WorkloadSpec,
    loads: Sequence[Load],
    *,
    duration: float,
    warmup: float,
    seed: int = 0,
    policy: str = "least-outstanding",
    slo: SLO | None = None,
    on_point: Callable[[PointResult], None] | None = None,
) -> list[PointResult]:
    out = []
    for load in loads:
        res = simulate_point(
            dep, workload, load, duration=duration, warmup=warmup, seed=seed, policy=policy, slo=slo
        )
        out.append(res)
        if on_point:
            on_point(res)
    return out
