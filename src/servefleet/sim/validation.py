"""Simulated against measured: replay each point of a real vLLM grid in the simulator.

A measured point is one `vllm bench serve` run (random prompts of fixed lengths, `--ignore-eos`,
closed loop at `--max-concurrency`, a fixed number of prompts). The simulator runs the same
requests through the same deployment and computes the same figures the way `vllm bench serve`
does (TTFT and TPOT per request; ITL as per-chunk gaps; output throughput over the run's span).
"""

from __future__ import annotations

import csv
import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from servefleet.routing import make_policy
from servefleet.sim.cluster import ClusterSim
from servefleet.sim.deployment import Deployment
from servefleet.sim.runner import build_replicas
from servefleet.workload import build_source, validate_workload

METRICS = (
    "mean_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "p99_tpot_ms",
    "mean_itl_ms",
    "p99_itl_ms",
    "output_throughput",
)
GOALS = {"tpot": 0.10, "output_throughput": 0.10, "ttft": 0.15}
"""Median absolute relative error allowed per metric family (issue: ground truth on the H200)."""


@dataclass(frozen=True, slots=True)
class MeasuredPoint:
    name: str
    input_len: int
    prefix_len: int
    output_len: int
    concurrency: int
    num_prompts: int
    figures: dict[str, float]

    @property
    def workload(self):
        cls: dict = {"prompt": self.input_len, "output": self.output_len}
        if self.prefix_len:
            cls["system_prompt"] = {"tokens": self.prefix_len, "share": 1.0}
        return validate_workload(
            {
                "name": self.name,
                "arrival": {"type": "poisson", "rate": 1.0},
                "classes": {"random": cls},
            },
            origin=f"measured point {self.name}",
        )


def load_points(path: Path | str) -> list[MeasuredPoint]:
    """The points of ``points.csv`` that finished (``ok``)."""
    out = []
    with Path(path).open() as f:
        for row in csv.DictReader(f):
            if row["ok"] != "True":
                continue
            out.append(
                MeasuredPoint(
                    name=row["name"],
                    input_len=int(row["input_len"]),
                    prefix_len=int(row["prefix_len"]),
                    output_len=int(row["output_len"]),
                    concurrency=int(row["concurrency"]),
                    num_prompts=int(row["num_prompts"]),
                    figures={m: float(row[m]) for m in METRICS},
                )
            )
    return out


def simulate_point_like_bench(dep: Deployment, p: MeasuredPoint, seed: int = 0) -> dict[str, float]:
    """Run ``p``'s requests in the simulator and measure them as `vllm bench serve` does."""
    source = build_source(p.workload, seed=seed, concurrency=p.concurrency)
    res = ClusterSim(build_replicas(dep), make_policy("round-robin"), source).run(
        1e9, max_requests=p.num_prompts
    )
    recs = [r for r in res.records if r.ok]
    ttft = np.array([r.ttft for r in recs]) * 1000
    tpot = np.array([r.tpot for r in recs if r.tpot is not None]) * 1000
    gaps = np.concatenate([np.diff(r.chunk_times) for r in recs]) * 1000
    span = max(r.end_time for r in recs) - min(r.send_time for r in recs)
    return {
        "mean_ttft_ms": float(ttft.mean()),
        "p99_ttft_ms": float(np.percentile(ttft, 99)),
        "mean_tpot_ms": float(tpot.mean()),
        "p99_tpot_ms": float(np.percentile(tpot, 99)),
        "mean_itl_ms": float(gaps.mean()),
        "p99_itl_ms": float(np.percentile(gaps, 99)),
        "output_throughput": sum(r.output_tokens for r in recs) / span,
    }


@dataclass(slots=True)
class Row:
    point: MeasuredPoint
    simulated: dict[str, float]

    def error(self, metric: str) -> float:
        """Relative error of the simulation against the measurement."""
        return self.simulated[metric] / self.point.figures[metric] - 1


def validate(dep: Deployment, points: list[MeasuredPoint], seed: int = 0) -> list[Row]:
    return [Row(p, simulate_point_like_bench(dep, p, seed)) for p in points]


def median_abs_error(rows: list[Row], metric: str) -> float:
    return statistics.median(abs(r.error(metric)) for r in rows)


def markdown_table(rows: list[Row]) -> str:
    head = "| point | held out | " + " | ".join(f"{m} sim / real (err)" for m in METRICS) + " |"
    lines = [head, "|" + "---|" * (len(METRICS) + 2)]
    for r in rows:
        cells = [
            f"{r.simulated[m]:,.1f} / {r.point.figures[m]:,.1f} ({r.error(m):+.0%})"
            for m in METRICS
        ]
        lines.append(
            f"| {r.point.name} | {'yes' if is_held_out(r.point) else 'no'} | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(lines)


def is_held_out(p: MeasuredPoint) -> bool:
    """The fit uses single-stream points and the 1024/256 sweep; every other point is held out."""
    return not (
        p.concurrency == 1 or (p.input_len == 1024 and p.output_len == 256 and p.concurrency <= 16)
    )
