"""A simulated benchmark point, and sweeps of them: the virtual world's `bench`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from servefleet.records import RequestRecord
from servefleet.routing import make_policy
from servefleet.routing.pools import DEFAULT_POOL, LONG_POOL
from servefleet.sim.cluster import ClusterSim, SharedGPU, SimReplica
from servefleet.sim.deployment import Deployment
from servefleet.sim.finishing import MIN_REQUESTS, Finishing, FinishingProcess, spare_core
from servefleet.sim.record_sink import RecordsMode
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
    stopped_at: float | None = None
    """When the run gave up early (``stop_waiting``); None: it ran to the end."""


def build_replicas(dep: Deployment, long_replicas: int = 0) -> list[SimReplica]:
    """The deployment's replicas; with ``replicas_per_gpu`` > 1, consecutive replicas share
    a GPU (as ``servefleet up`` places them). The last ``long_replicas`` form the ``long``
    pool (the length-pools policies send long prompts there)."""
    k = dep.replicas_per_gpu
    cost, config = dep.cost_model(), dep.scheduler_config()  # pure: one for all replicas
    switch = cost.eff.gpu_share_switch_s
    gpus = [SharedGPU(switch) if k > 1 else None for _ in range(-(-dep.replicas // k))]
    first_long = dep.replicas - long_replicas
    return [
        SimReplica(
            f"replica-{i}",
            config,
            cost,
            pool=LONG_POOL if i >= first_long else DEFAULT_POOL,
            gpu=gpus[i // k],
            client=dep.client,
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
    keep_records: bool = True,
    records: tuple[Path, RecordsMode] | None = None,
    records_process: bool | None = False,
    stop_waiting: int | None = None,
    long_replicas: int = 0,
    on_progress: Callable[[float], None] | None = None,
) -> PointResult:
    """One load point. The summary is accumulated as requests finish (``SummaryStream``);
    ``keep_records=False`` keeps no record in memory; ``records``: write them (a path, and
    all, a sample or none: ``RecordSink``) as they finish. ``records_process``: make the
    records, the summary and the file in a helper process on another core
    (``sim.finishing``; the same results): True always, None when the point is large enough
    to gain and a second core is there, False never; never while records are kept.
    ``stop_waiting``: stop early once more requests than this wait for their first token
    (``ClusterSim.run``); the result then says when (``stopped_at``). ``long_replicas``: the
    last replicas form the ``long`` pool (``build_replicas``). ``on_progress``: told the
    simulated time now and then (``ClusterSim.run``)."""
    if not 0 <= warmup < duration:
        raise ValueError(f"warm-up ({warmup} s) must be shorter than the duration ({duration} s)")
    source = build_source(workload, seed=seed, rate=load.rate, concurrency=load.concurrency)
    if not 0 <= long_replicas < dep.replicas or (long_replicas and dep.replicas < 2):
        raise ValueError(
            f"--long-replicas must leave at least one of the {dep.replicas} replicas to the "
            f"default pool, got {long_replicas}"
        )
    replicas = build_replicas(dep, long_replicas)
    stream = SummaryStream(
        Window(warmup, duration),
        slo,
        class_slos,
        by_class=workload.trace is not None or len(workload.classes) > 1,
        by_turn=workload.trace is not None or any(c.session for c in workload.classes.values()),
    )
    if records_process is None:  # a closed loop's users send at most about one a second each
        records_process = load.value * duration >= MIN_REQUESTS and spare_core()
    finishing: Finishing | FinishingProcess
    if records_process and not keep_records:
        finishing = FinishingProcess(stream, records)
    else:
        finishing = Finishing(stream, records, keep=keep_records)
    try:
        sim = ClusterSim(replicas, make_policy(policy), source, dep.answers, on_finished=finishing)
        result = sim.run(duration, stop_waiting=stop_waiting, on_progress=on_progress)
    except BaseException:
        finishing.abort()
        raise
    done = finishing.close()
    peak = max((r.log.peak_kv_usage for r in replicas), default=0.0)
    prompt = sum(r.engine.prefix_stats.prompt_tokens for r in replicas)
    cached = sum(r.engine.prefix_stats.cached_tokens for r in replicas)
    hit_rate = cached / prompt if prompt else None
    last_end = max(done.last_end, 0.0)
    t1 = max(last_end, duration, 1e-6)
    busy = busy_series([(r.name, r.log.start, r.log.end) for r in replicas], 0.0, t1)
    return PointResult(
        load,
        done.kept,
        done.summary,
        busy,
        peak,
        hit_rate,
        done.records,
        last_end,
        result.stopped_at,
    )


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
