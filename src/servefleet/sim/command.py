"""`servefleet simulate`: a deployment × a workload × a list of loads, in simulation."""

from __future__ import annotations

import json
import multiprocessing as mp
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from servefleet.records import write_jsonl
from servefleet.report.knee import KneeRule, find_knee
from servefleet.sim.deployment import Deployment
from servefleet.sim.record_sink import RecordSink, RecordsMode
from servefleet.sim.runner import Load, PointResult, simulate_point
from servefleet.stats import SLO, class_slos
from servefleet.workload import WorkloadSpec


@dataclass(slots=True)
class SimulateRun:
    deployment: Deployment
    workload: WorkloadSpec
    points: list[PointResult]
    knee: int | None
    knee_rule: KneeRule
    wall_seconds: float
    settings: dict
    records_dir: Path | None = None
    """Where the points' records were written while simulating (None: kept in memory)."""

    def summary_dict(self) -> dict:
        dep = self.deployment
        mem = dep.memory()
        return {
            "kind": "simulate",
            "deployment": deployment_dict(dep),
            "memory_per_gpu": {
                "total": mem.total,
                "budget": mem.budget,
                "weights": mem.weights,
                "activation_peak": mem.activation_peak,
                "non_torch": mem.non_torch,
                "cuda_graphs": mem.cuda_graphs,
                "kv_cache": mem.kv_cache,
                "kv_bytes_per_token": mem.kv_bytes_per_token,
                "num_gpu_blocks": mem.num_gpu_blocks,
                "kv_tokens": mem.kv_tokens,
            },
            "workload": self.workload.model_dump(mode="json"),
            "settings": self.settings,
            "knee": self.knee,
            "knee_rule": self.knee_rule.describe(),
            "complete": True,
            "points": [point_dict(p) for p in self.points],
            "wall_seconds": self.wall_seconds,
        }


def deployment_dict(dep: Deployment) -> dict:
    return {
        "model": dep.model.name,
        "gpu": dep.gpu.name,
        "tp": dep.tp,
        "replicas": dep.replicas,
        "replicas_per_gpu": dep.replicas_per_gpu,
        "dtype": dep.dtype,
        "max_model_len": dep.max_model_len,
        "max_num_seqs": dep.max_num_seqs,
        "max_num_batched_tokens": dep.max_num_batched_tokens,
        "gpu_memory_utilization": dep.gpu_memory_utilization,
        "block_size": dep.block_size,
        "enable_prefix_caching": dep.enable_prefix_caching,
        "enforce_eager": dep.enforce_eager,
        "kv_cache_dtype": dep.kv_dtype,
        "vllm_version": dep.vllm_version,
        "resent_answers": dep.answers.name,
        "notes": list(dep.notes),
    }


def point_dict(p: PointResult) -> dict:
    return {
        "load": p.load.to_dict(),
        "summary": p.summary.to_dict(),
        "peak_kv_usage": p.peak_kv_usage,
        "prefix_hit_rate": p.prefix_hit_rate,
        "records": p.num_records,
        "gpu_busy": p.gpu_busy.to_dict(),
    }


def run_simulate(
    dep: Deployment,
    workload: WorkloadSpec,
    loads: list[Load],
    *,
    duration: float,
    warmup: float,
    seed: int,
    policy: str,
    slo: SLO,
    on_point: Callable[[int, PointResult], None] | None = None,
    records: RecordsMode = "all",
    out: Path | None = None,
    jobs: int = 1,
    long_replicas: int = 0,
) -> SimulateRun:
    """Simulate every load point, in up to ``jobs`` worker processes (points are independent:
    the same results in any number). With ``out``, each point's records (``records``: all, a
    sample or none) are written there as its requests finish and none are kept in memory;
    without it they are kept, for ``write_run``."""
    dep.scheduler_config()  # fail early, with the memory arithmetic, if it does not fit
    t0 = time.perf_counter()
    point = partial(
        _point,
        dep,
        workload,
        duration=duration,
        warmup=warmup,
        seed=seed,
        policy=policy,
        slo=slo,
        records=records,
        out=out,
        long_replicas=long_replicas,
    )
    points: list[PointResult] = []
    with point_pool(min(jobs, len(loads))) as pool:
        results = pool.map(point, loads) if pool is not None else map(point, loads)
        for i, p in enumerate(results):
            points.append(p)
            if on_point:
                on_point(i, p)
    rule = KneeRule()
    knee = find_knee(
        [p.load.value for p in points],
        [p.summary.output_throughput for p in points],
        [p.summary.ttft.p95 for p in points],
        rule,
    )
    settings = {
        "duration": duration,
        "warmup": warmup,
        "seed": seed,
        "policy": policy,
        "slo": {"ttft": slo.ttft, "itl": slo.itl},
        "records": records,
    }
    if long_replicas:
        settings["long_replicas"] = long_replicas
    run = SimulateRun(dep, workload, points, knee, rule, time.perf_counter() - t0, settings)
    run.records_dir = out
    return run


def _point(
    dep: Deployment,
    workload: WorkloadSpec,
    load: Load,
    *,
    records: RecordsMode,
    out: Path | None,
    slo: SLO,
    **kw,
) -> PointResult:
    """One point of ``run_simulate`` (in a worker process or this one)."""
    sink = RecordSink(records_path(out, load), records) if out is not None else None
    try:
        return simulate_point(
            dep,
            workload,
            load,
            slo=slo,
            class_slos=class_slos(workload.model_dump(mode="json"), slo),
            keep_records=sink is None,
            on_record=sink,
            **kw,
        )
    finally:
        if sink is not None:
            sink.close()


@contextmanager
def point_pool(jobs: int) -> Iterator[ProcessPoolExecutor | None]:
    """Worker processes for ``jobs`` > 1 points at once; None for one.

    Workers are forked by a fork server (``forkserver``; ``spawn`` where there is none), a
    process with no thread but its own that has loaded the simulator once, never by this one:
    a fork copies every lock that another thread holds at that moment, held for ever, and this
    process has such threads — the CLI's progress display (rich: its console lock, and in a
    terminal it replaces sys.stdout and sys.stderr by proxies that take that lock), a caller's.
    Costs ~0.3 s of wall time once per process (the server's start and imports), then a few ms
    a worker (benchmarks/sim_pool_start.py)."""
    if jobs <= 1:
        yield None
        return
    methods = mp.get_all_start_methods()
    ctx = mp.get_context("forkserver" if "forkserver" in methods else "spawn")
    if ctx.get_start_method() == "forkserver":
        ctx.set_forkserver_preload([__name__])  # the workers' code, imported once
    with ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
        yield pool


def records_path(out_dir: Path, load: Load) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    return out_dir / f"records-{load.tag}.jsonl.gz"


def write_run(run: SimulateRun, out_dir: Path) -> Path:
    """``summary.json``, and the records of points that kept them in memory (sorted by send
    time; records written while simulating are in the order requests finished)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").write_text(json.dumps(run.summary_dict(), indent=2))
    if run.records_dir != out_dir:
        for p in run.points:
            recs = sorted(p.records, key=lambda r: r.send_time)
            write_jsonl(recs, records_path(out_dir, p.load))
    return out_dir
