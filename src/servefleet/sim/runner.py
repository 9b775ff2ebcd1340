"""A simulated benchmark point, and sweeps of them: the virtual world's `bench`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from servefleet.engine.engine import Engine
from servefleet.records import RequestRecord
from servefleet.routing import make_policy
from servefleet.sim.cluster import ClusterSim, SharedGPU, SimReplica
from servefleet.sim.deployment import Deployment
from servefleet.stats import SLO, Summary, Window
from servefleet.stream_stats import SummaryStream
from servefleet.telemetry.busy import busy_series
from servefleet.telemetry.series import GpuSeries
from servefleet.workload import WorkloadSpec, build_source
from servefleet.workload.types import Load

__all__ = ["Load", "PointResult", "build_replicas", "simulate_point", "sweep"]


@dataclass(slots=True)
class PointResult:
    load: Load
    records: list[RequestRecord]
    """Every request's record, in the order they finished (empty unless ``keep_records``)."""
    summary: Summary
    gpu_busy: GpuSeries
    """The modelled busy share of each replica's GPU(s) over the point (100 bins from 0 to
    the last request's end, or the duration): what measured utilization is held against."""
    peak_kv_usage: float
    prefix_hit_rate: float | None
    """Prompt tokens served from the prefix cache ÷ prompt tokens, over the requests admitted
    by every replica (each counted once; docs/metrics.md); None without prefix caching."""
    num_records: int = 0
    """Requests that finished (every record, kept or not)."""
    last_end: float = 0.0
    """When the last request ended (0 if none did)."""


def build_replicas(dep: Deployment) -> list[SimReplica]:
    """The deployment's replicas; with ``replicas_per_gpu`` > 1, consecutive replicas share
    a GPU (as ``servefleet up`` places them)."""
    k = dep.replicas_per_gpu
    cost, config = dep.cost_model(), dep.scheduler_config()  # pure: one for all replicas
    switch = cost.eff.gpu_share_switch_s
    gpus = [SharedGPU(switch) if k > 1 else None for _ in range(-(-dep.replicas // k))]
    return [
        SimReplica(f"replica-{i}", Engine(config, cost), gpu=gpus[i // k])
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
    keep_records: bool = True,
    on_record: Callable[[RequestRecord], None] | None = None,
) -> PointResult:
    """One load point. The summary is accumulated as requests finish (``SummaryStream``);
    ``keep_records=False`` keeps no record in memory (``on_record`` still sees each one)."""
    if not 0 <= warmup < duration:
        raise ValueError(f"warm-up ({warmup} s) must be shorter than the duration ({duration} s)")
    source = build_source(workload, seed=seed, rate=load.rate, concurrency=load.concurrency)
    replicas = build_replicas(dep)
    stream = SummaryStream(
        Window(warmup, duration),
        slo,
        class_slos,
        by_class=workload.trace is not None or len(workload.classes) > 1,
        by_turn=workload.trace is not None or any(c.session for c in workload.classes.values()),
    )
    kept: list[RequestRecord] = []
    sinks = [stream.add, *([kept.append] if keep_records else []), *filter(None, [on_record])]

    def finished(r: RequestRecord) -> None:
        for sink in sinks:
            sink(r)

    ClusterSim(replicas, make_policy(policy), source, dep.answers, finished).run(duration)
    peak = max((max(r.log.kv_usage, default=0.0) for r in replicas), default=0.0)
    prompt = sum(r.engine.scheduler.kv.stats.prompt_tokens for r in replicas)
    cached = sum(r.engine.scheduler.kv.stats.cached_tokens for r in replicas)
    hit_rate = cached / prompt if prompt else None
    last_end = max(stream.last_end, 0.0)
    t1 = max(last_end, duration, 1e-6)
    busy = busy_series([(r.name, r.log.start, r.log.end) for r in replicas], 0.0, t1)
    summary = stream.summary()
    return PointResult(load, kept, summary, busy, peak, hit_rate, stream.records, last_end)


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
