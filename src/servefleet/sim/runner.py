"""A simulated benchmark point, and sweeps of them: the virtual world's `bench`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from servefleet.records import RequestRecord
from servefleet.routing import make_policy
from servefleet.sim.cluster import ClusterSim, SimReplica
from servefleet.sim.deployment import Deployment
from servefleet.stats import SLO, Summary, Window, summarize
from servefleet.workload import WorkloadSpec, build_source


@dataclass(frozen=True, slots=True)
class Load:
    """A closed loop of ``concurrency`` requests in flight, or open-loop arrivals at ``rate``."""

    concurrency: int | None = None
    rate: float | None = None

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError("a load point is either a concurrency or a rate")

    @property
    def label(self) -> str:
        return f"c={self.concurrency}" if self.concurrency is not None else f"{self.rate:g} req/s"

    @property
    def value(self) -> float:
        return float(self.concurrency if self.concurrency is not None else self.rate)


@dataclass(slots=True)
class PointResult:
    load: Load
    records: list[RequestRecord]
    summary: Summary
    replicas: list[SimReplica]
    peak_kv_usage: float
    prefix_hit_rate: float | None
    """Prefix-cache hits ÷ queried tokens, summed over replicas (vLLM's definition)."""


def build_replicas(dep: Deployment) -> list[SimReplica]:
    return [SimReplica(f"replica-{i}", dep.build_engine()) for i in range(dep.replicas)]


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
) -> PointResult:
    if not 0 <= warmup < duration:
        raise ValueError(f"warm-up ({warmup} s) must be shorter than the duration ({duration} s)")
    source = build_source(workload, seed=seed, rate=load.rate, concurrency=load.concurrency)
    replicas = build_replicas(dep)
    result = ClusterSim(replicas, make_policy(policy), source).run(duration)
    summary = summarize(result.records, Window(warmup, duration), slo)
    peak = max((max(r.log.kv_usage, default=0.0) for r in replicas), default=0.0)
    q = sum(r.engine.scheduler.kv.stats.queries for r in replicas)
    h = sum(r.engine.scheduler.kv.stats.hits for r in replicas)
    return PointResult(load, result.records, summary, replicas, peak, h / q if q else None)


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
