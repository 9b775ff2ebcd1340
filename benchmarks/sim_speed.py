"""How fast the fleet simulator runs.

Two modes:

* ``python benchmarks/sim_speed.py`` — the seed fleet (4 × TP=2 V100, Qwen1.5-14B,
  chat-3tier) saturated (closed loop, 512) for 10 simulated minutes: simulated output tokens
  per CPU second of the event loop (best of ``--repeat``).
* ``python benchmarks/sim_speed.py --replicas 1,8,64,256`` — how the cost grows with the
  fleet: Llama-2-7B on A100-80G, TP=1, 1000 prompt / 300 output tokens, Poisson 4.5 req/s per
  replica, 120 s. For each size, in fresh processes: the event loop alone (CPU seconds), and
  ``servefleet simulate`` end to end, from process start to records written (wall and CPU
  seconds, peak RSS). Median of ``--repeat``; sizes and modes interleaved. A large point
  makes its records in a second process (``sim/finishing.py``): end to end, CPU seconds count
  both processes and the peak RSS is of all of them together.

The machine's load average is printed with the numbers (on a shared machine, wall time is
not CPU time).

``python benchmarks/sim_speed.py --instructions 16`` counts the instructions the event loop
runs instead (16 replicas, the scaling scenario; valgrind's callgrind, from the compiled
``ClusterSim.run`` in, so it needs the compiled core): the same count on a loaded or a slower
machine, where CPU time is not. Instructions are not time (a cold cache costs cycles, not
instructions), so a change that counts fewer still has its time measured; ~2 minutes a version.

``python benchmarks/sim_speed.py --misses 1024`` counts, with callgrind's cache simulation, the
instructions and the L2 misses of the event loop at 1,024 replicas over the first 8 simulated
seconds (last-level cache set to 2 MiB, an L2's size): at that scale the loop is bound by
memory (an event costs ~1.7x what it costs at 16 replicas), and these counts show a change in
cache misses that wall time on a shared machine hides (docs/simulate.md, "How it is made fast").
~6 minutes a version; with ``--against`` the two run side by side, one core each.

Absolute speeds depend on the machine (the same code ran 2x slower on one 2-core machine than
on another; benchmarks/RESULTS.md). ``--against DIR`` runs every measurement a second time, interleaved, with
another version's source folder on ``PYTHONPATH`` (e.g. ``git worktree add --detach ../base
<commit>`` then ``--against ../base/src``) and prints that version's numbers and the ratio:
a ratio measured in the same run holds on any machine. ``--against pure`` measures this code
again as pure Python (``SERVEFLEET_PURE_PYTHON=1``): what the compiled core
(``servefleet/compiled.py``) gains. Every version's line says which core it ran.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from servefleet.compiled import PURE_ENV, core
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


def seed_run(minutes: float, concurrency: int) -> dict:
    """One seed-fleet run in this process (run as a child: ``--seed-child``)."""
    dep = resolve_deployment(
        load_model("Qwen1.5-14B"),
        get_gpu("V100-SXM2-32G"),
        tp=2,
        num_gpus=8,
        max_model_len=4096,
        max_num_seqs=256,
    )
    replicas = build_replicas(dep)
    source = build_source(load_workload("chat-3tier"), seed=0, concurrency=concurrency)
    t0 = time.process_time()
    res = ClusterSim(replicas, make_policy("least-outstanding"), source).run(minutes * 60)
    cpu = time.process_time() - t0
    return {
        "core": core(),
        "cpu": cpu,
        "tokens": sum(r.output_tokens for r in res.records),
        "sim_time": float(res.end_time),
        "steps": sum(len(r.log.end) for r in res.replicas),
        "requests": len(res.records),
    }


def seed_benchmark(minutes: float, concurrency: int, repeat: int, against: str | None) -> None:
    versions = _versions(against)
    runs: dict[str, list[dict]] = {name: [] for name in versions}
    for _ in range(repeat):
        for name, env in versions.items():
            cmd = [sys.executable, __file__, "--seed-child", f"{minutes},{concurrency}"]
            runs[name].append(_child_json(cmd, env))
    print(f"seed fleet (4 x TP=2 V100, Qwen1.5-14B, chat-3tier, concurrency {concurrency})")
    speed = {}
    for name in versions:
        b = min(runs[name], key=lambda r: r["cpu"])
        cpu, tokens = b["cpu"], b["tokens"]
        speed[name] = tokens / cpu
        print(f" {name} ({b['core']}):")
        print(
            f"  simulated: {b['sim_time']:,.0f} s, {b['requests']:,} requests, {tokens:,} output "
            f"tokens, {b['steps']:,} engine steps"
        )
        print(f"  CPU time (best of {repeat}): {cpu:.2f} s")
        print(f"  simulated output tokens per CPU second: {tokens / cpu:,.0f}  (target 800,000)")
        print(f"  simulated time / CPU time: {b['sim_time'] / cpu:,.1f}x")
        print(f"  engine steps per CPU second: {b['steps'] / cpu:,.0f}")
    if against:
        print(f" this code / {against}: {speed['this code'] / speed[against]:.2f}x")
    print(f"  load average: {_load()}")


def _versions(against: str | None) -> dict[str, dict[str, str]]:
    """The versions to measure, each with what its children's environment changes."""
    versions: dict[str, dict[str, str]] = {"this code": {}}
    if against == "pure":
        versions[against] = {PURE_ENV: "1"}
    elif against:
        versions[against] = {"PYTHONPATH": against}
    return versions


# -- the fleet-size table --------------------------------------------------------------------
def scale_loop(replicas: int, duration: float = DURATION) -> dict:
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
    sim.run(duration)
    return {
        "core": core(),
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


def _child(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float, float, str]:
    """(wall s, CPU s, peak RSS GB, output) of a child process, from its start to its end.
    CPU counts its children that it waited for (``servefleet simulate``'s records process);
    the peak RSS is that of the child and all its descendants together, sampled every 0.1 s
    (with psutil, ``pip install -e '.[bench]'``; without it the child's own peak, with a
    warning)."""
    with tempfile.TemporaryFile("w+") as f:
        t0 = time.perf_counter()
        p = subprocess.Popen(
            cmd,
            stdout=f,
            stderr=subprocess.STDOUT,
            env=os.environ | {"COLUMNS": "200"} | (env or {}),
        )
        peak = [0]
        done = threading.Event()
        watch = threading.Thread(target=_watch_rss, args=(p.pid, done, peak), daemon=True)
        watch.start()
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        done.set()
        watch.join()
        p.returncode = os.waitstatus_to_exitcode(status)
        f.seek(0)
        out = f.read()
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out}")
    return wall, ru.ru_utime + ru.ru_stime, max(ru.ru_maxrss * 1024, peak[0]) / 1e9, out


def _watch_rss(pid: int, done: threading.Event, peak: list[int]) -> None:
    """Keep in ``peak[0]`` the largest summed RSS (bytes) of ``pid`` and its descendants
    (psutil, the ``bench`` extra; without it, the child's own peak from ``wait4`` stands)."""
    try:
        import psutil
    except ImportError:
        return
    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    while not done.wait(0.1):
        total = 0
        try:
            for q in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                    total += q.memory_info().rss
        except psutil.NoSuchProcess:
            return
        peak[0] = max(peak[0], total)


def _child_json(cmd: list[str], env: dict[str, str]) -> dict:
    """The JSON line a child measurement printed last."""
    return json.loads(_child(cmd, env)[3].strip().splitlines()[-1])


CALLGRIND_ROOT = "CPyDef_cluster___ClusterSim___run"
"""The compiled event loop's C function: callgrind counts from its call in."""


MISSES_SECONDS = 8.0
"""Simulated seconds of ``--misses`` (a cache simulation runs ~50x slower than the loop)."""
MISSES_LL = "2097152,16,64"
"""``--misses``'s simulated last-level cache: 2 MiB, 16-way, 64-byte lines (an L2's size)."""


def instructions_table(replicas: int, against: str | None, misses: bool = False) -> None:
    """Instructions of the event loop (``--loop``), this code and ``against``'s; with
    ``misses``, under a cache simulation, and its L2 misses (the versions side by side)."""
    if shutil.which("valgrind") is None:
        raise SystemExit("--instructions and --misses need valgrind (apt install valgrind)")
    what = "instructions and L2 misses" if misses else "instructions"
    cache = ["--cache-sim=yes", f"--LL={MISSES_LL}"] if misses else []
    loop = ["--loop", str(replicas)] + (["--loop-seconds", str(MISSES_SECONDS)] if misses else [])
    print(
        f"{what} of the event loop, {replicas} replicas of the scaling scenario"
        + (f", {MISSES_SECONDS:g} s" if misses else "")
        + f" (valgrind --tool=callgrind {' '.join(cache)} --toggle-collect={CALLGRIND_ROOT})"
    )
    with tempfile.TemporaryDirectory() as d, ThreadPoolExecutor(2 if misses else 1) as pool:
        jobs = {
            name: pool.submit(
                _child,
                [
                    "valgrind",
                    "--tool=callgrind",
                    *cache,
                    f"--toggle-collect={CALLGRIND_ROOT}",
                    f"--callgrind-out-file={d}/{i}.out",
                    sys.executable,
                    __file__,
                    *loop,
                ],
                env,
            )
            for i, (name, env) in enumerate(_versions(against).items())
        }
        counts = {}
        for name, job in jobs.items():
            out = job.result()[3]
            run = json.loads(next(line for line in out.splitlines() if line.startswith("{")))
            if not run["core"].startswith("compiled"):
                print(f" {name}: {run['core']}: needs the compiled core; skipped")
                continue
            events = re.search(r"Events *: ([\w ]+)", out)
            collected = [int(x) for x in re.search(r"Collected : ([\d ]+)", out).group(1).split()]
            got = (
                dict(zip(events.group(1).split(), collected, strict=True))
                if events
                else {"Ir": collected[0]}
            )
            ir = got["Ir"]
            l2 = got.get("DLmr", 0) + got.get("DLmw", 0) + got.get("ILmr", 0)
            counts[name] = (ir, l2)
            line = (
                f" {name}: {ir:,} instructions, {ir / run['tokens']:,.0f} a simulated output token"
            )
            print(line + (f"; {l2:,} L2 misses" if misses else ""))
    if len(counts) == 2:
        (mine, mine_l2), (other, other_l2) = counts.values()
        ratios = f"{mine / other:.3f}x the instructions"
        if misses and other_l2:
            ratios += f", {mine_l2 / other_l2:.3f}x the L2 misses"
        print(f" this code / {against}: {ratios}")


def scale_table(sizes: list[int], repeat: int, records: str, against: str | None) -> None:
    if importlib.util.find_spec("psutil") is None:
        print(
            "warning: psutil is missing (pip install -e '.[bench]'): the peak RSS is the main "
            "process's alone, not with its records process"
        )
    print(
        f"Llama-2-7B, A100-80G-SXM, TP=1, {PROMPT} in / {OUTPUT} out, Poisson "
        f"{RATE_PER_REPLICA:g} req/s per replica, {DURATION:g} s; end to end: servefleet "
        f"simulate --records {records}; median of {repeat}"
    )
    print(f"load average at start: {_load()}")
    versions = _versions(against)
    rows = {name: {n: {} for n in sizes} for name in versions}
    cores: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeat):
            for n in sizes:
                for name, env in versions.items():
                    r: dict[str, list[float]] = rows[name][n]
                    loop = _child_json([sys.executable, __file__, "--loop", str(n)], env)
                    cores[name] = loop["core"]
                    r.setdefault("tokens", []).append(loop["tokens"])
                    r.setdefault("requests", []).append(loop["requests"])
                    r.setdefault("loop", []).append(loop["tokens"] / loop["cpu"])
                    wall, cpu, rss, _ = _child(scale_cli(n, Path(tmp) / f"n{n}", records), env)
                    r.setdefault("e2e_wall", []).append(loop["tokens"] / wall)
                    r.setdefault("e2e_cpu", []).append(loop["tokens"] / cpu)
                    r.setdefault("wall", []).append(wall)
                    r.setdefault("rss", []).append(rss)
    med = {
        name: {n: {k: statistics.median(v) for k, v in rows[name][n].items()} for n in sizes}
        for name in versions
    }
    for name in versions:
        print(f"{name} ({cores[name]}):")
        print(
            "| replicas | requests | output tokens | event loop tok/CPU-s | end to end tok/s "
            "(wall) | end to end tok/CPU-s | end to end wall s | peak RSS |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for n in sizes:
            m = med[name][n]
            print(
                f"| {n:,} | {m['requests']:,.0f} | {m['tokens']:,.0f} | {m['loop']:,.0f} | "
                f"{m['e2e_wall']:,.0f} | {m['e2e_cpu']:,.0f} | {m['wall']:.1f} | "
                f"{m['rss']:.2f} GB |"
            )
    if against:
        print(f"this code / {against} (same run): event loop, end to end per wall second")
        for n in sizes:
            a, b = med["this code"][n], med[against][n]
            print(
                f"  {n:,} replicas: {a['loop'] / b['loop']:.2f}x, {a['e2e_wall'] / b['e2e_wall']:.2f}x"
            )
    m_all = med["this code"]
    if 256 in m_all:
        m = m_all[256]
        print(
            f"256 replicas: {m['e2e_wall']:,.0f} tok per wall second end to end (target "
            f">= 500,000 on one core), peak RSS {m['rss']:.2f} GB (target <= 1 GB)"
        )
    if 1024 in m_all:
        print(f"1,024 replicas: {m_all[1024]['wall']:.0f} s end to end (target < 60 s)")
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
    ap.add_argument(
        "--against",
        metavar="DIR",
        help="another version's source folder (its PYTHONPATH), or 'pure' (this code as pure "
        "Python): measure it too, interleaved",
    )
    ap.add_argument(
        "--instructions",
        type=int,
        metavar="N",
        help="count the event loop's instructions at N replicas (valgrind) instead of timing",
    )
    ap.add_argument(
        "--misses",
        type=int,
        metavar="N",
        help="count the event loop's instructions and L2 misses at N replicas, 8 simulated "
        "seconds, under a cache simulation (valgrind) instead of timing",
    )
    ap.add_argument("--loop", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--loop-seconds", type=float, default=DURATION, help=argparse.SUPPRESS)
    ap.add_argument("--seed-child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.loop:
        print(json.dumps(scale_loop(args.loop, args.loop_seconds)))
    elif args.seed_child:
        minutes, concurrency = args.seed_child.split(",")
        print(json.dumps(seed_run(float(minutes), int(concurrency))))
    elif args.instructions:
        instructions_table(args.instructions, args.against)
    elif args.misses:
        instructions_table(args.misses, args.against, misses=True)
    elif args.replicas:
        sizes = [int(x) for x in args.replicas.split(",")]
        scale_table(sizes, args.repeat, args.records, args.against)
    else:
        seed_benchmark(args.minutes, args.concurrency, args.repeat, args.against)


if __name__ == "__main__":
    main()
