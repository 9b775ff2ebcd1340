"""How fast the fleet simulator runs: the seed fleet, saturated, for 10 simulated minutes.

Prints simulated output tokens per wall-clock second (target >= 500,000 on one core) and the
ratio of simulated time to wall time. Usage: python benchmarks/sim_speed.py [--minutes 10]
"""

from __future__ import annotations

import argparse
import time

from servefleet.hardware import get_gpu
from servefleet.models import load_model
from servefleet.routing import make_policy
from servefleet.sim.cluster import ClusterSim
from servefleet.sim.deployment import resolve_deployment
from servefleet.sim.runner import build_replicas
from servefleet.workload import build_source, load_workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--concurrency", type=int, default=512, help="fleet-wide, closed loop")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    dep = resolve_deployment(
        load_model("Qwen1.5-14B"),
        get_gpu("V100-SXM2-32G"),
        tp=2,
        num_gpus=8,
        max_model_len=4096,
        max_num_seqs=256,
    )
    spec = load_workload("chat-3tier")
    best = None
    for _ in range(args.repeat):
        replicas = build_replicas(dep)
        source = build_source(spec, seed=0, concurrency=args.concurrency)
        t0 = time.process_time()
        res = ClusterSim(replicas, make_policy("least-outstanding"), source).run(args.minutes * 60)
        cpu = time.process_time() - t0
        tokens = sum(r.output_tokens for r in res.records)
        steps = sum(len(r.log.end) for r in res.replicas)
        if best is None or cpu < best[0]:
            best = (cpu, tokens, res.end_time, steps, len(res.records))
    cpu, tokens, sim_time, steps, n = best
    print(f"seed fleet (4 x TP=2 V100, Qwen1.5-14B, chat-3tier, concurrency {args.concurrency})")
    print(
        f"  simulated: {sim_time:,.0f} s, {n:,} requests, {tokens:,} output tokens, {steps:,} engine steps"
    )
    print(f"  CPU time (best of {args.repeat}): {cpu:.2f} s")
    print(f"  simulated output tokens per CPU second: {tokens / cpu:,.0f}  (target 500,000)")
    print(f"  simulated time / CPU time: {sim_time / cpu:,.1f}x")
    print(f"  engine steps per CPU second: {steps / cpu:,.0f}")


if __name__ == "__main__":
    main()
