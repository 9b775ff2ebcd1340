"""`servefleet simulate`: a deployment × a workload × a list of loads, in simulation."""

from __future__ import annotations

import json
import multiprocessing as mp
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from servefleet.records import write_jsonl
from servefleet.sim.deployment import Deployment
from servefleet.sim.record_sink import RecordsMode
from servefleet.sim.runner import Load, PointResult, simulate_point
from servefleet.stats import SLO, KneeRule, class_slos, find_knee
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
            "client": dep.client.to_dict(),
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
        "client_protocol": dep.client.name,
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
    slo_classes: dict[str, SLO] | None = None,
    on_point: Callable[[int, PointResult], None] | None = None,
    records: RecordsMode = "all",
    out: Path | None = None,
    jobs: int = 1,
    long_replicas: int = 0,
    on_progress: Callable[[int, float], None] | None = None,
) -> SimulateRun:
    """Simulate every load point, in up to ``jobs`` worker processes (points are independent:
    the same results in any number). With ``out``, each point's records (``records``: all, a
    sample or none) are written there as its requests finish and none are kept in memory;
    without it they are kept, for ``write_run``. ``on_point(i, result)``: point ``i`` is done
    (in order); ``on_progress(i, t)``: point ``i`` has simulated ``t`` seconds (now and then,
    from this process's thread or, with workers, from another). ``slo_classes``: the classes
    the SLOs are judged on, each with its own (``stats.parse_slo_classes``; None: every
    request)."""
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
        slo_classes=slo_classes,
        records=records,
        out=out,
        long_replicas=long_replicas,
        # a large point alone in this process makes its records on another core
        records_process=None if min(jobs, len(loads)) <= 1 else False,
    )
    points: list[PointResult] = []
    with point_pool(min(jobs, len(loads)), on_progress) as pool:
        if pool is not None:
            results = pool.map(point, enumerate(loads))
        else:
            results = map(partial(point, progress=on_progress), enumerate(loads))
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
    if slo_classes is not None:
        settings["slo_classes"] = {
            n: {"ttft": s.ttft, "itl": s.itl} for n, s in slo_classes.items()
        }
    if long_replicas:
        settings["long_replicas"] = long_replicas
    run = SimulateRun(dep, workload, points, knee, rule, time.perf_counter() - t0, settings)
    run.records_dir = out
    return run


_worker_progress: Callable[[int, float], None] | None = None
"""In a worker process of ``point_pool``: where its points' progress goes."""


def _point(
    dep: Deployment,
    workload: WorkloadSpec,
    item: tuple[int, Load],
    *,
    records: RecordsMode,
    out: Path | None,
    slo: SLO,
    slo_classes: dict[str, SLO] | None = None,
    progress: Callable[[int, float], None] | None = None,
    **kw,
) -> PointResult:
    """Point ``i`` of ``run_simulate`` (``item``: ``i`` and its load), in a worker process
    or this one (then its progress goes to ``progress``)."""
    i, load = item
    report = progress or _worker_progress
    return simulate_point(
        dep,
        workload,
        load,
        slo=slo,
        class_slos={**class_slos(workload.model_dump(mode="json"), slo), **(slo_classes or {})},
        keep_records=out is None,
        records=(records_path(out, load), records) if out is not None else None,
        on_progress=partial(report, i) if report is not None else None,
        **kw,
    )


@contextmanager
def point_pool(
    jobs: int, on_progress: Callable[[int, float], None] | None = None
) -> Iterator[ProcessPoolExecutor | None]:
    """Worker processes for ``jobs`` > 1 points at once; None for one. The workers' progress
    reports (``_worker_progress``) come back through a queue to ``on_progress``, called from a
    thread of this process, every report before the pool's context ends.

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
    if on_progress is None:
        with ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
            yield pool
        return
    queue = ctx.SimpleQueue()
    drain = threading.Thread(target=_drain, args=(queue, on_progress), daemon=True)
    drain.start()
    try:
        with ProcessPoolExecutor(
            jobs, mp_context=ctx, initializer=_report_to, initargs=(queue,)
        ) as pool:
            yield pool
    finally:  # the workers have exited: all they put is in the queue, before this
        queue.put(None)
        drain.join()


def _report_to(queue) -> None:
    """A worker's initializer: its points' progress goes to ``queue``."""
    global _worker_progress
    _worker_progress = lambda i, t: queue.put((i, t))  # noqa: E731


def _drain(queue, on_progress: Callable[[int, float], None]) -> None:
    """Hand the reports to ``on_progress`` until the end (None); if it fails, keep emptying
    the queue (a worker must never wait on a full pipe for a display)."""
    show = True
    while (item := queue.get()) is not None:
        if show:
            try:
                on_progress(*item)
            except Exception:
                show = False


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
