"""How fast the fleet simulator runs.

Two modes:

* ``python benchmarks/sim_speed.py`` — the seed fleet (4 × TP=2 V100, Qwen1.5-14B,
  chat-3tier) saturated (closed loop, 512) for 10 simulated minutes: simulated output tokens
  per CPU second of the event loop (best of ``--repeat``).
* ``python benchmarks/sim_speed.py --replicas 1,8,64,256`` — how the cost grows with the
  fleet: Llama-2-7B on A100-80G, TP=1, 1000 prompt / 300 output tokens, Poisson 4.5 req/s per
  replica, 120 s. For each size, in fresh processes: the event loop alone (CPU seconds), and
  ``servefleet simulate`` end to end, from process start to records written (wall and CPU
  seconds, peak RSS). Median of ``--repeat``; sizes and modes interleaved.

The machine's load average is printed with the numbers (on a shared machine, wall time is
not CPU time).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from servefleet.hardware import get_gpu
from servefleet.models import load_model
from servefleet.routing import make_policy
from servefleet.sim.cluster import ClusterSim
from servefleet.sim.deployment import resolve_deployment
from servefleet.sim.runner import build_replicas
from servefleet.workload import build_source, fixed_workload, load_workload

RATE_PER_REPLICA = 4.5
PROMPT, OUTPUT = 1000, 300
DURATION = 120.0


def seed_benchmark(minutes: float, concurrency: int, repeat: int) -> None:
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
    for _ in range(repeat):
        replicas = build_replicas(dep)
        source = build_source(spec, seed=0, concurrency=concurrency)
        t0 = time.process_time()
        res = ClusterSim(replicas, make_policy("least-outstanding"), source).run(minutes * 60)
        cpu = time.process_time() - t0
        tokens = sum(r.output_tokens for r in res.records)
        steps = sum(len(r.log.end) for r in res.replicas)
        if best is None or cpu < best[0]:
            best = (cpu, tokens, res.end_time, steps, len(res.records))
    cpu, tokens, sim_time, steps, n = best
    print(f"seed fleet (4 x TP=2 V100, Qwen1.5-14B, chat-3tier, concurrency {concurrency})")
    print(
        f"  simulated: {sim_time:,.0f} s, {n:,} requests, {tokens:,} output tokens, {steps:,} engine steps"
    )
    print(f"  CPU time (best of {repeat}): {cpu:.2f} s")
    print(f"  simulated output tokens per CPU second: {tokens / cpu:,.0f}  (target 800,000)")
    print(f"  simulated time / CPU time: {sim_time / cpu:,.1f}x")
    print(f"  engine steps per CPU second: {steps / cpu:,.0f}")
    print(f"  load average: {_load()}")


# -- the fleet-size table --------------------------------------------------------------------
def scale_loop(replicas: int) -> dict:
    """The event loop alone, in this process (run as a child: ``--loop N``)."""
    dep = resolve_deployment(
        load_model("Llama-2-7B"),
        get_gpu("A100-80G-SXM"),
        tp=1,
        num_gpus=replicas,
        max_model_len=4096,
        max_num_seqs=256,
    )
    source = build_source(fixed_workload(PROMPT, OUTPUT), seed=0, rate=RATE_PER_REPLICA * replicas)
    tokens = n = 0

    def count(r) -> None:
        nonlocal tokens, n
        tokens += r.output_tokens
        n += 1

    sim = ClusterSim(build_replicas(dep), make_policy("least-outstanding"), source, on_record=count)
    t0, w0 = time.process_time(), time.perf_counter()
    sim.run(DURATION)
    return {
        "cpu": time.process_time() - t0,
        "wall": time.perf_counter() - w0,
        "tokens": tokens,
        "requests": n,
    }


def scale_cli(replicas: int, out: Path, records: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "servefleet.cli",
        "simulate",
        "--model",
        "Llama-2-7B",
        "--gpu",
        "A100-80G-SXM",
        "--num-gpus",
        str(replicas),
        "--tp",
        "1",
        "--input-len",
        str(PROMPT),
        "--output-len",
        str(OUTPUT),
        "--rate",
        f"{RATE_PER_REPLICA * replicas:g}",
        "--duration",
        f"{DURATION:g}",
        "--records",
        records,
        "--out",
        str(out),
    ]


def _child(cmd: list[str]) -> tuple[float, float, float, str]:
    """(wall s, CPU s, peak RSS GB, output) of a child process, from its start to its end."""
    with tempfile.TemporaryFile("w+") as f:
        t0 = time.perf_counter()
        p = subprocess.Popen(
            cmd, stdout=f, stderr=subprocess.STDOUT, env=os.environ | {"COLUMNS": "200"}
        )
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        f.seek(0)
        out = f.read()
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out}")
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss * 1024 / 1e9, out


def scale_table(sizes: list[int], repeat: int, records: str) -> None:
    print(
        f"Llama-2-7B, A100-80G-SXM, TP=1, {PROMPT} in / {OUTPUT} out, Poisson "
        f"{RATE_PER_REPLICA:g} req/s per replica, {DURATION:g} s; end to end: servefleet "
        f"simulate --records {records}; median of {repeat}"
    )
    print(f"load average at start: {_load()}")
    rows: dict[int, dict[str, list[float]]] = {n: {} for n in sizes}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeat):
            for n in sizes:
                r = rows[n]
                _, _, _, out = _child([sys.executable, __file__, "--loop", str(n)])
                loop = json.loads(out.strip().splitlines()[-1])
                r.setdefault("tokens", []).append(loop["tokens"])
                r.setdefault("requests", []).append(loop["requests"])
                r.setdefault("loop", []).append(loop["tokens"] / loop["cpu"])
                wall, cpu, rss, _ = _child(scale_cli(n, Path(tmp) / f"n{n}", records))
                r.setdefault("e2e_wall", []).append(loop["tokens"] / wall)
                r.setdefault("e2e_cpu", []).append(loop["tokens"] / cpu)
                r.setdefault("wall", []).append(wall)
                r.setdefault("rss", []).append(rss)
    print(
        "| replicas | requests | output tokens | event loop tok/CPU-s | end to end tok/s "
        "(wall) | end to end tok/CPU-s | end to end wall s | peak RSS |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for n in sizes:
        m = {k: statistics.median(v) for k, v in rows[n].items()}
        print(
            f"| {n:,} | {m['requests']:,.0f} | {m['tokens']:,.0f} | {m['loop']:,.0f} | "
            f"{m['e2e_wall']:,.0f} | {m['e2e_cpu']:,.0f} | {m['wall']:.1f} | {m['rss']:.2f} GB |"
        )
    for n in sizes:
        m = {k: statistics.median(v) for k, v in rows[n].items()}
        if n == 256:
            print(
                f"256 replicas: {m['e2e_wall']:,.0f} tok per wall second end to end (target "
                f">= 500,000 on one core), peak RSS {m['rss']:.2f} GB (target <= 1 GB)"
            )
        if n == 1024:
            print(f"1,024 replicas: {m['wall']:.0f} s end to end (target < 60 s)")
    print(f"load average at end: {_load()}")


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--minutes", type=float, default=10.0, help="seed benchmark")
    ap.add_argument("--concurrency", type=int, default=512, help="seed benchmark, fleet-wide")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--replicas", help="fleet sizes for the scaling table, e.g. 1,8,64,256")
    ap.add_argument("--records", default="sample", help="simulate --records (scaling table)")
    ap.add_argument("--loop", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.loop:
        print(json.dumps(scale_loop(args.loop)))
    elif args.replicas:
        scale_table([int(x) for x in args.replicas.split(",")], args.repeat, args.records)
    else:
        seed_benchmark(args.minutes, args.concurrency, args.repeat)


if __name__ == "__main__":
    main()
