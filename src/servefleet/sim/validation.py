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

from servefleet.client_protocol import VLLM_BENCH_SERVE, of_bench
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
    run: str = ""
    """The measured run (one server: model, dtype and flags) the point belongs to."""

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
                    run=row["run"],
                )
            )
    return out


def simulate_point_like_bench(dep: Deployment, p: MeasuredPoint, seed: int = 0) -> dict[str, float]:
    """Run ``p``'s requests in the simulator and measure them as `vllm bench serve` does
    (streaming as it does: ``VLLM_BENCH_SERVE``)."""
    source = build_source(p.workload, seed=seed, concurrency=p.concurrency)
    replicas = build_replicas(dep.with_(client=VLLM_BENCH_SERVE))
    res = ClusterSim(replicas, make_policy("round-robin"), source).run(
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
    head = "| run | point | section | " + " | ".join(f"{m} sim / real (err)" for m in METRICS)
    lines = [head + " |", "|" + "---|" * (len(METRICS) + 3)]
    for r in rows:
        cells = [
            f"{r.simulated[m]:,.1f} / {r.point.figures[m]:,.1f} ({r.error(m):+.0%})"
            for m in METRICS
        ]
        lines.append(
            f"| {r.point.run} | {r.point.name} | {section(r.point)} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)


FIT_RUNS = ("", "run1_grid", "h200-q1.5-bf16")
"""Runs whose low-concurrency points the host overheads are fitted to (the 7B grid and the
small bf16 model); every point of any other run (fp8, overload, other shapes) is held out."""


def is_held_out(p: MeasuredPoint) -> bool:
    """The fit uses single-stream points and the 1024/256 sweep up to concurrency 16 of the
    ``FIT_RUNS``; every other point is held out."""
    return p.run not in FIT_RUNS or not (
        p.concurrency == 1 or (p.input_len == 1024 and p.output_len == 256 and p.concurrency <= 16)
    )


SECTIONS = (
    "fitted",
    "held out, calibrated GPU and shape",
    "other model shapes",
    "other GPUs and TP",
    "overload and bursts",
)
"""docs/validation.md's sections, in order. "other GPUs and TP" has no measured point (one H200
was measured): its figures are derived from cited kernel-level data (docs/hardware.md)."""
CALIBRATED_RUNS = ("", "run1_grid", "run2_overload")
"""Runs of the calibrated shape (Qwen2.5-7B, bf16, TP=1 on the H200)."""


def section(p: MeasuredPoint) -> str:
    """Which of ``SECTIONS`` a grid point belongs to. Overload: more concurrent KV demand than
    fits (it preempts), or more streams than vLLM's API server keeps up with (c >= 256)."""
    if not is_held_out(p):
        return SECTIONS[0]
    if p.name.startswith("overload") or p.concurrency >= 256:
        return SECTIONS[4]
    if p.run in CALIBRATED_RUNS:
        return SECTIONS[1]
    return SECTIONS[2]


@dataclass(frozen=True, slots=True)
class MixComparison:
    """One open-loop bench point (``servefleet bench``) against ``simulate_point`` of its fleet:
    the figures of the burst criterion (docs/validation.md), simulated and measured."""

    name: str
    simulated: dict[str, float]
    measured: dict[str, float]

    def error(self, metric: str) -> float:
        return self.simulated[metric] / self.measured[metric] - 1


MIX_METRICS = ("output_throughput", "ttft.p95", "tpot.mean", "e2e_latency.p50", "cached_ratio")


def summary_figures(summary: dict) -> dict[str, float]:
    """``MIX_METRICS`` of a ``Summary.to_dict()``."""
    out = {}
    for m in MIX_METRICS:
        v = summary
        for k in m.split("."):
            v = v[k]
        out[m] = float(v)
    return out


def compare_bench(dep: Deployment, policy: str, bench: dict) -> list[MixComparison]:
    """Each point of a ``servefleet bench`` summary (open loop) against ``simulate_point`` of
    the same deployment, workload, seed, duration and warm-up, with the client protocol the
    bench streamed with."""
    from servefleet.sim.runner import simulate_point
    from servefleet.workload import recorded_workload
    from servefleet.workload.types import Load

    settings, out = bench["settings"], []
    dep = dep.with_(client=of_bench(bench))
    workload = recorded_workload(bench)
    for point in bench["points"]:
        load = Load(**point["load"])
        sim = simulate_point(
            dep,
            workload,
            load,
            duration=settings["duration"],
            warmup=settings["warmup"],
            seed=settings["seed"],
            policy=policy,
        )
        out.append(
            MixComparison(
                point["label"],
                summary_figures(sim.summary.to_dict()),
                summary_figures(point["summary"]),
            )
        )
    return out
