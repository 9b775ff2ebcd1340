"""`servefleet simulate`: a deployment × a workload × a list of loads, in simulation."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from servefleet.records import write_jsonl
from servefleet.report.knee import KneeRule, find_knee
from servefleet.sim.deployment import Deployment
from servefleet.sim.runner import Load, PointResult, simulate_point
from servefleet.stats import SLO, class_slos
from servefleet.telemetry.busy import busy_series
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
            "points": [point_dict(p, self.settings.get("duration")) for p in self.points],
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


def point_dict(p: PointResult, duration: float | None = None) -> dict:
    return {
        "load": p.load.to_dict(),
        "summary": p.summary.to_dict(),
        "peak_kv_usage": p.peak_kv_usage,
        "prefix_hit_rate": p.prefix_hit_rate,
        "records": len(p.records),
        "gpu_busy": gpu_busy(p, duration),
    }


def gpu_busy(p: PointResult, duration: float | None) -> dict:
    """The predicted busy share of each replica's GPU(s) over the point (100 bins from 0 to
    the last request's end): what measured utilization is held against."""
    ends = [r.end_time for r in p.records if r.end_time is not None]
    t1 = max([*ends, duration or 0.0], default=0.0)
    return busy_series(
        [(r.name, r.log.start, r.log.end) for r in p.replicas], 0.0, max(t1, 1e-6)
    ).to_dict()


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
    long_replicas: int = 0,
) -> SimulateRun:
    dep.scheduler_config()  # fail early, with the memory arithmetic, if it does not fit
    t0 = time.perf_counter()
    points = []
    for i, load in enumerate(loads):
        p = simulate_point(
            dep,
            workload,
            load,
            duration=duration,
            warmup=warmup,
            seed=seed,
            policy=policy,
            slo=slo,
            class_slos=class_slos(workload.model_dump(mode="json"), slo),
            long_replicas=long_replicas,
        )
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
    }
    if long_replicas:
        settings["long_replicas"] = long_replicas
    return SimulateRun(dep, workload, points, knee, rule, time.perf_counter() - t0, settings)


def write_run(run: SimulateRun, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").write_text(json.dumps(run.summary_dict(), indent=2))
    for p in run.points:
        tag = f"c{p.load.concurrency}" if p.load.concurrency is not None else f"r{p.load.rate:g}"
        write_jsonl(
            sorted(p.records, key=lambda r: r.send_time), out_dir / f"records-{tag}.jsonl.gz"
        )
    return out_dir
