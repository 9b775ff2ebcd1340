"""The simulator against real `servefleet bench` runs, by client protocol: each point of each
run replayed with the protocol the run streamed with (its endpoint, per-chunk usage or not),
the same workload, loads, duration, warm-up and seed; TTFT P50/P95, ITL P50/P95, TPOT mean,
E2E P50 and output throughput, simulated / measured.

    python benchmarks/real_vllm/validate_hostwork.py RUN [RUN ...] (--fleet fleet.yaml |
        --model M --gpu G [--max-model-len N]) [--held-out-only] [--held-out 256,...]

A RUN is a bench output folder (its ``summary.json`` and records), e.g. a series of the
host-work grid (``bench/<mix>-<endpoint>-usage<on|off>``) or
``benchmarks/real_gpu/data/h200-1x-c160-usage/bench-*``. ``--held-out`` names the concurrencies
no fit used (the grid holds out c=256: ``host_points.HELD_OUT``); ``--held-out-only`` prints
only those. The summary at the end: the worst |error| of each metric per protocol over the
points printed, and whether it is within the targets (15 % for latencies, 5 % throughput).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

from servefleet.client_protocol import of_bench
from servefleet.hardware import get_gpu
from servefleet.models import load_model
from servefleet.plan.fleet_yaml import load_fleet
from servefleet.sim.deployment import Deployment, resolve_deployment
from servefleet.sim.runner import simulate_point
from servefleet.workload import recorded_workload
from servefleet.workload.types import Load

METRICS = {
    "ttft.p50": 0.15,
    "ttft.p95": 0.15,
    "itl.p50": 0.15,
    "itl.p95": 0.15,
    "tpot.mean": 0.15,
    "e2e_latency.p50": 0.15,
    "output_throughput": 0.05,
}
"""Each metric and its target |simulated / measured - 1|."""


def get(summary: dict, path: str) -> float | None:
    v = summary
    for k in path.split("."):
        v = v[k]
    return None if v is None else float(v)


def replay(dep: Deployment, policy: str, run: Path, held_out: set[int], only_held: bool):
    """(protocol, concurrency, held out, simulated summary, measured summary) per point."""
    bench = json.loads((run / "summary.json").read_text())
    client = of_bench(bench)
    s = bench["settings"]
    spec = recorded_workload(bench)
    for point in bench["points"]:
        c = point["load"]["concurrency"]
        rate = point["load"].get("rate")
        held = c in held_out
        if only_held and not held:
            continue
        sim = simulate_point(
            dep.with_(client=client),
            spec,
            Load(concurrency=c, rate=rate),
            duration=s["duration"],
            warmup=s["warmup"],
            seed=s["seed"],
            policy=policy,
        )
        yield client, c, held, sim.summary.to_dict(), point["summary"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--fleet", type=Path, help="the fleet.yaml the runs served")
    ap.add_argument("--model", help="model preset (without --fleet)")
    ap.add_argument("--gpu", default="H200-SXM")
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--held-out", default="256", help="concurrencies no fit used")
    ap.add_argument("--held-out-only", action="store_true")
    ap.add_argument(
        "--gpu-param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="replace a field of the GPU's Efficiency (servefleet.hardware), e.g. per_seq_overhead_s=9e-5",
    )
    args = ap.parse_args()
    if args.fleet:
        fleet = load_fleet(args.fleet)
        dep = resolve_deployment(
            load_model(fleet.model.name), get_gpu(fleet.gpus.type), **fleet.deployment_settings()
        )
        policy = fleet.gateway.policy.name
    elif args.model:
        dep = resolve_deployment(
            load_model(args.model), get_gpu(args.gpu), tp=1, max_model_len=args.max_model_len
        )
        policy = "least-outstanding"
    else:
        ap.error("give --fleet or --model")
    if args.gpu_param:
        values = {k: float(v) for k, _, v in (p.partition("=") for p in args.gpu_param)}
        dep = dep.with_(gpu=dep.gpu.with_efficiency(replace(dep.gpu.efficiency, **values)))
    held_out = {int(c) for c in args.held_out.split(",") if c}
    worst: dict[str, dict[str, float]] = defaultdict(dict)
    print("| run | protocol | c | held out | " + " | ".join(METRICS) + " |")
    print("|---|---|---:|---|" + "---:|" * len(METRICS))
    for run in args.runs:
        for client, c, held, sim, real in replay(dep, policy, run, held_out, args.held_out_only):
            cells = []
            for m in METRICS:
                a, b = get(sim, m), get(real, m)
                if a is None or b is None:  # no finished request in the point's window
                    cells.append("—")
                    continue
                err = a / b - 1
                worst[client.name][m] = max(worst[client.name].get(m, 0.0), abs(err))
                scale = 1 if m == "output_throughput" else 1e3
                cells.append(f"{a * scale:,.1f} / {b * scale:,.1f} ({err:+.0%})")
            print(f"| {run.name} | {client.name} | {c} | {'yes' if held else 'no'} | "
                  + " | ".join(cells) + " |")  # fmt: skip
    print("\nworst |sim / real - 1| per protocol (target):")
    for name, errs in worst.items():
        print(f"  {name}: " + ", ".join(
            f"{m} {e:.0%}{'' if e <= METRICS[m] else ' (over ' + format(METRICS[m], '.0%') + ')'}"
            for m, e in errs.items()))  # fmt: skip


if __name__ == "__main__":
    main()
