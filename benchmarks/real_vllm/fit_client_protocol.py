"""Fit the API server's work per stream chunk for each chat client protocol
(``servefleet.sim.client_protocol.STREAM_WORK``) on the fit runs only, and print the errors on
the held-out runs.

The fit runs (``FIT``): one H200 replica at concurrency 160 measured twice back to back, the
same server and requests, once with usage on every chunk and once without
(``benchmarks/real_gpu/data/h200-1x-c160-usage``). Both saturate vLLM's API server (its
chunks carry 1.46 and 1.55 tokens: several engine steps' tokens each), and a saturated server's
one CPU is busy all the time: ``chunks/s x chunk_s + req/s x (frontend_request_s + prompt
tokens x frontend_prompt_token_s) = 1``, which gives ``chunk_s`` (the derivation of the
completions protocol's 64 us, ``REFERENCE``). Per-token work is not separable from it here:
every saturated point carries 1.2-1.6 tokens per chunk (``token_s`` stays 0).

Held out (``HELD_OUT``, never fitted): the real-GPU fleets measured with usage on every chunk
at other loads (``h200-1x`` c=16..256, ``h200-2x-shared`` c=8..128): the same accounting where
they saturate, and the simulator's TTFT P50/P95, ITL P50/P95, TPOT mean and E2E P50
(``METRICS``) replayed with ``STREAM_WORK``.

Usage: python benchmarks/real_vllm/fit_client_protocol.py
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
from pathlib import Path

from servefleet.client_protocol import ClientProtocol, of_bench
from servefleet.hardware import get_gpu
from servefleet.models import load_model
from servefleet.plan.fleet_yaml import load_fleet
from servefleet.sim.client_protocol import STREAM_WORK
from servefleet.sim.deployment import resolve_deployment
from servefleet.sim.runner import simulate_point
from servefleet.workload import recorded_workload
from servefleet.workload.types import Load

DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "real_gpu" / "data"
METRICS = ("ttft.p50", "ttft.p95", "itl.p50", "itl.p95", "tpot.mean", "e2e_latency.p50")
FIT = {
    ClientProtocol("chat", True): ("h200-1x-c160-usage", "bench-continuous-usage"),
    ClientProtocol("chat", False): ("h200-1x-c160-usage", "bench-no-continuous-usage"),
}
HELD_OUT = (("h200-1x", "bench"), ("h200-2x-shared", "bench"))


def get(summary: dict, path: str) -> float:
    v = summary
    for k in path.split("."):
        v = v[k]
    return float(v)


def replay(
    run: str, bench_dir: str, chunk_s: float | None = None, seed_offset: int = 0
) -> list[tuple[int, dict, dict]]:
    """(concurrency, simulated summary, measured summary) of each point of a bench run,
    simulated with the run's protocol; ``chunk_s``: that protocol's chunk cost instead of
    ``STREAM_WORK``'s; ``seed_offset`` added to the run's seed (another draw of the same
    workload)."""
    fleet = load_fleet(DATA / run / "fleet.yaml")
    bench = json.loads((DATA / run / bench_dir / "summary.json").read_text())
    client = of_bench(bench)
    dep = resolve_deployment(
        load_model(fleet.model.name),
        get_gpu(fleet.gpus.type),
        **fleet.deployment_settings(),
        client=client,
    )
    if chunk_s is not None:  # the reference cost scaled so that this protocol's is chunk_s
        eff = dep.gpu.efficiency
        scaled = eff.frontend_chunk_s * chunk_s / STREAM_WORK[client].chunk_s
        dep = dep.with_(
            gpu=dep.gpu.with_efficiency(dataclasses.replace(eff, frontend_chunk_s=scaled))
        )
    s = bench["settings"]
    out = []
    for point in bench["points"]:
        c = point["load"]["concurrency"]
        sim = simulate_point(
            dep,
            recorded_workload(bench),
            Load(concurrency=c),
            duration=s["duration"],
            warmup=s["warmup"],
            seed=s["seed"] + seed_offset,
            policy=fleet.gateway.policy.name,
        )
        out.append((c, sim.summary.to_dict(), point["summary"]))
    return out


def table(title: str, points: list[tuple[int, dict, dict]]) -> None:
    print(f"\n{title}")
    print("| c | " + " | ".join(f"{m} sim / real (err)" for m in METRICS) + " |")
    for c, sim, real in points:
        cells = []
        for m in METRICS:
            a, b = get(sim, m) * 1e3, get(real, m) * 1e3
            cells.append(f"{a:,.1f} / {b:,.1f} ({a / b - 1:+.0%})")
        print(f"| {c} | " + " | ".join(cells) + " |")


SATURATED = 1.05
"""Tokens per chunk above which the API server counts as saturated (it merges steps)."""


def accounting(run: str, bench_dir: str) -> list[tuple[int, float, float | None]]:
    """(concurrency, tokens per chunk, chunk cost if saturated) of each point, per replica,
    over the requests sent in the point's window."""
    fleet = load_fleet(DATA / run / "fleet.yaml")
    n = len(fleet.replicas)
    bench = json.loads((DATA / run / bench_dir / "summary.json").read_text())
    eff = get_gpu(fleet.gpus.type).efficiency
    out = []
    for p in bench["points"]:
        w0, w1 = p["window"]["start"], p["window"]["end"]
        with gzip.open(DATA / run / bench_dir / p["records_file"], "rt") as f:
            recs = [json.loads(line) for line in f]
        win = [r for r in recs if r["status"] == "ok" and w0 <= r["send_time"] < w1]
        tpc = sum(sum(r["chunk_tokens"]) for r in win) / sum(len(r["chunk_times"]) for r in win)
        s = p["summary"]
        chunks = s["output_throughput"] / tpc / n
        admit = (
            s["request_throughput"]
            / n
            * (eff.frontend_request_s + s["prompt_tokens"]["mean"] * eff.frontend_prompt_token_s)
        )
        out.append(
            (p["load"]["concurrency"], tpc, (1 - admit) / chunks if tpc > SATURATED else None)
        )
    return out


def main() -> None:
    argparse.ArgumentParser(description=__doc__).parse_args()
    for client, (run, bench_dir) in FIT.items():
        for c, tpc, chunk_s in accounting(run, bench_dir):
            assert chunk_s is not None, f"{client.name} c={c} is not saturated"
            print(f"fit {client.name} c={c}: {tpc:.3f} tokens/chunk, chunk cost {chunk_s * 1e6:.0f} us "
                  f"(STREAM_WORK: {STREAM_WORK[client].chunk_s * 1e6:.0f} us)")  # fmt: skip
    for run, bench_dir in HELD_OUT:
        bench = json.loads((DATA / run / bench_dir / "summary.json").read_text())
        work = STREAM_WORK[of_bench(bench)].chunk_s
        for c, tpc, chunk_s in accounting(run, bench_dir):
            cost = (
                f"chunk cost {chunk_s * 1e6:.0f} us, STREAM_WORK {work / chunk_s - 1:+.0%}"
                if chunk_s
                else "not saturated"
            )
            print(f"held out {run} c={c}: {tpc:.3f} tokens/chunk, {cost}")
    for client, (run, bench_dir) in FIT.items():
        table(f"fit run {client.name} (STREAM_WORK)", replay(run, bench_dir))
    for run, bench_dir in HELD_OUT:
        table(f"held out {run} (STREAM_WORK)", replay(run, bench_dir))


if __name__ == "__main__":
    main()
