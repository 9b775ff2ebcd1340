"""Microseconds per routing decision, each policy, plain scan against a kept LoadIndex.

A fleet of ``n`` replicas of Llama-2-7B on A100-80G-SXM (the sim_speed scenario's kind) in a
steady state (about 40 requests in flight each, some prefills pending); each pick routes a
request of 500-1500 prompt tokens (a third behind one of four shared system prompts), then
one replica gets a first token and one a finished request, as in the simulator. "scan" hands
the policy a plain list (the gateway's way), "index" a kept ``LoadIndex`` updated after each
change (the simulator's way); the two modes run interleaved in one process on the same
sequence of requests and must pick the same replicas. Times include the index's upkeep.

    python benchmarks/routing_speed.py [--replicas 8,64,256,1024] [--picks 2000]
"""

from __future__ import annotations

import argparse
import os
import random
import time

from servefleet.routing import POLICIES, LoadIndex, ReplicaView, RequestContext, make_policy
from servefleet.routing.predicted import cost_model_for
from servefleet.routing.prefix import chain_hashes


def fleet(n: int, cost) -> list[ReplicaView]:
    rng = random.Random(n)
    views = []
    for i in range(n):
        inf = rng.randrange(30, 50)
        views.append(
            ReplicaView(f"replica-{i}", in_flight=inf, in_flight_tokens=inf * 1300, cost=cost)
        )
    return views


def run(name: str, n: int, picks: int, kept: bool, cost) -> tuple[float, float, list[int]]:
    """(wall s, CPU s, positions picked) for ``picks`` decisions."""
    rng = random.Random(7)
    views = fleet(n, cost)
    pos = {id(v): i for i, v in enumerate(views)}
    idx = LoadIndex(views, tracks_prefills=True) if kept else None
    target = idx if kept else views
    policy = make_policy(name)
    pending: list[tuple[ReplicaView, int]] = []
    chosen = []
    policy.select(target, RequestContext("warm-up", 1000, 300, "s0"))  # builds rings, heaps
    w0, c0 = time.perf_counter(), time.process_time()
    for q in range(picks):
        p = rng.randrange(500, 1500)
        group = rng.randrange(12)
        hashes = chain_hashes(bytes([group, j]) for j in range(4)) if group < 4 else ()
        ctx = RequestContext(f"q{q}", p, 300, f"s{rng.randrange(200)}", hashes)
        sel = policy.select(target, ctx)
        v = sel.replica
        chosen.append(pos[id(v)])
        v.in_flight += 1
        v.in_flight_tokens += p + 300
        v.pending_prefills += 1
        v.pending_prefill_tokens += p
        pending.append((v, p))
        if idx is not None:
            idx.update(v)
        policy.on_routed(v, ctx)
        if len(pending) > n // 8 + 1:  # a first token
            u, tok = pending.pop(rng.randrange(len(pending)))
            u.pending_prefills -= 1
            u.pending_prefill_tokens -= tok
            if idx is not None:
                idx.update(u)
        u = views[rng.randrange(n)]  # a finished request
        if u.in_flight > u.pending_prefills:
            u.in_flight -= 1
            u.in_flight_tokens -= 1300
            if idx is not None:
                idx.update(u)
    return time.perf_counter() - w0, time.process_time() - c0, chosen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", default="8,64,256,1024")
    ap.add_argument("--picks", type=int, default=2000)
    ap.add_argument("--policies", default=",".join(POLICIES))
    args = ap.parse_args()
    cost = cost_model_for("Llama-2-7B", "A100-80G-SXM")
    sizes = [int(x) for x in args.replicas.split(",")]
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("| policy | replicas | scan µs/pick (CPU) | index µs/pick (CPU) | scan ÷ index |")
    print("|---|---:|---:|---:|---:|")
    for name in args.policies.split(","):
        for n in sizes:
            picks = args.picks if n <= 256 else max(200, args.picks // 4)
            scan_cpu = index_cpu = 0.0
            for _ in range(2):  # interleaved: scan, index, scan, index
                _, sc, a = run(name, n, picks, False, cost)
                _, ic, b = run(name, n, picks, True, cost)
                assert a == b, f"{name} at {n}: the index picked differently from the scan"
                scan_cpu += sc
                index_cpu += ic
            s_us, i_us = 1e6 * scan_cpu / (2 * picks), 1e6 * index_cpu / (2 * picks)
            print(f"| {name} | {n} | {s_us:.1f} | {i_us:.1f} | {s_us / i_us:.1f} |", flush=True)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
