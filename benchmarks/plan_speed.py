"""How long the full seed-case plan takes: wall time, CPU seconds (this process and its worker
processes), per stage, with the machine's load average before and after.

    python benchmarks/plan_speed.py [--repeat 2] [--jobs 2] [-- extra plan options]

Goal: the full seed-case plan (Qwen1.5-14B on 8 x V100-SXM2-32G, chat-3tier,
TTFT P95 <= 2 s, ITL P95 <= 100 ms; screening, flag variants, long runs, verification at fresh
seeds and the uncertainty band) in <= 30 s of wall time on the 2-core development machine.
Wall time depends on what else runs there: read it with the load average and the CPU seconds.
"""

from __future__ import annotations

import argparse
import os
import resource
import time

from servefleet.plan.planner import PlanRequest, make_plan


def cpu_seconds() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def stage_cpu(plan) -> dict[str, float]:
    """CPU seconds of the simulated points, per stage."""
    out = {
        "screening + variants": sum(
            p.cpu for r in plan.topologies + plan.variants for p in r.points
        )
    }
    if plan.sustainability is not None:
        sus = plan.sustainability
        out["long runs"] = sum(p.cpu for r in sus.results for p in r.points)
        out["verification"] = sum(a.cpu for a in sus.attempts)
    if plan.band is not None:
        out["band corners"] = sum(
            p.cpu for tb in plan.band.topologies for r in tb.corners.values() for p in r.points
        )
        check = plan.band.pessimistic
        if check is not None and check.result is not None:
            out["pessimistic corner"] = sum(p.cpu for p in check.result.points)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=None)
    args = ap.parse_args()
    for i in range(args.repeat):
        load0 = os.getloadavg()
        t0, c0 = time.perf_counter(), cpu_seconds()
        plan = make_plan(PlanRequest(jobs=args.jobs))
        wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
        load1 = os.getloadavg()
        sus = plan.sustainability
        print(
            f"run {i + 1}: wall {wall:.1f} s, CPU {cpu:.1f} s (this process and its workers; "
            f"simulated points {plan.simulation_cpu:.1f} s in {plan.points_simulated} points), "
            f"{plan.jobs} workers, load average {load0[0]:.2f} -> {load1[0]:.2f} "
            f"(1 min), {os.cpu_count()} CPUs"
        )
        for name, secs in plan.stage_seconds.items():
            print(f"  {name:30s} {secs:5.1f} s wall")
        for name, cpu_s in stage_cpu(plan).items():
            print(f"  {name:30s} {cpu_s:5.1f} s CPU")
        print(
            f"  chosen {plan.chosen.candidate.label} at {plan.point.rate:g} req/s"
            + (f", verified: {sus.ok}, headroom {sus.headroom}" if sus else "")
            + f"; goal <= 30 s wall: {'met' if wall <= 30 else 'MISSED'}"
        )


if __name__ == "__main__":
    main()
