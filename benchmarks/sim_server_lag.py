"""How far the sim-server lags behind the engine model under load, and what it costs in CPU.

Starts a real sim-server process (default: Qwen2.5-7B on an H200, --time-scale 1), opens N
concurrent streaming completions (default 256) over loopback, and prints:

* the per-step delivery lag (actual wake-up time minus the step's modelled end): P50, P99, max
  over the measured steps (goal: under 1 ms at 256 running sequences);
* the CPU used by the server process and by this client, as seconds and as % of one core;
* a check that every stream got exactly its tokens, and the client-side mean inter-token gap
  against the model's mean step time.

    .venv/bin/python benchmarks/sim_server_lag.py [--streams 256] [--max-tokens 256]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import re
import select
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[1]
ADMIN = "bench"


def start(args: argparse.Namespace) -> tuple[subprocess.Popen[str], int]:
    cmd = [
        sys.executable, "-m", "servefleet.sim.server", "--model", args.model, "--gpu", args.gpu,
        "--max-model-len", "4096", "--startup-time", "0", "--port", "0",
        "--time-scale", str(args.time_scale), "--admin-token", ADMIN, "--disable-log-requests",
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO
    )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 60)
    line = proc.stdout.readline() if ready else ""
    m = re.search(r"port=(\d+)", line)
    if not m:
        proc.kill()
        raise SystemExit(f"sim-server did not start: {line!r}")
    return proc, int(m.group(1))


class Progress:
    """Fires once every stream has received ``settle`` tokens: all sequences are running and
    the burst of arrivals (parsed on the server's one thread) is behind."""

    def __init__(self, n: int, settle: int) -> None:
        self.n, self.settle, self.settled = n, settle, 0
        self.all_running = asyncio.Event()

    def tokens(self, before: int, after: int) -> None:
        if before < self.settle <= after:
            self.settled += 1
            if self.settled == self.n:
                self.all_running.set()


async def stream(
    session: aiohttp.ClientSession,
    url: str,
    i: int,
    args: argparse.Namespace,
    progress: Progress | None = None,
) -> tuple[int, int, list[float]]:
    """One streamed completion: (tokens, chunks, arrival time of each token)."""
    words = " ".join(f"w{i}x{k}" for k in range(args.prompt_words))
    body = {"prompt": words, "max_tokens": args.max_tokens, "stream": True}
    times: list[float] = []
    tokens = chunks = 0
    async with session.post(url, json=body) as r:
        r.raise_for_status()
        buf = b""
        async for chunk in r.content.iter_any():
            now = time.perf_counter()
            buf += chunk
            *frames, buf = buf.split(b"\n\n")
            for f in frames:
                if f.startswith(b"data: {"):  # a coalesced chunk holds several " word"s
                    i0 = f.index(b'"text":"') + 8
                    n = f.count(b" ", i0, f.index(b'"', i0))
                    if progress is not None:
                        progress.tokens(tokens, tokens + n)
                    tokens += n
                    chunks += 1
                    times.extend([now] * n)
    return tokens, chunks, times


async def run(args: argparse.Namespace, port: int) -> dict:
    base = f"http://127.0.0.1:{port}"
    url = base + "/v1/completions"
    admin = {"Authorization": f"Bearer {ADMIN}"}
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as session:

        async def stats() -> dict:
            async with session.get(base + "/sim/stats") as r:
                return await r.json()

        async def reset() -> None:
            async with session.post(base + "/admin/stats/reset", headers=admin) as r:
                r.raise_for_status()

        await asyncio.gather(*(stream(session, url, -i - 1, _small(args)) for i in range(8)))
        await reset()
        s0 = await stats()
        progress = Progress(args.streams, settle=max(1, args.max_tokens // 8))
        c0, t0 = time.process_time(), time.perf_counter()
        tasks = [
            asyncio.create_task(stream(session, url, i, args, progress))
            for i in range(args.streams)
        ]
        await progress.all_running.wait()  # every sequence running, the arrivals behind us
        s1 = await stats()
        await reset()
        t1 = time.perf_counter()
        results = await asyncio.gather(*tasks)
        wall = time.perf_counter() - t0
        client_cpu = time.process_time() - c0
        s2 = await stats()
    ok = all(n == args.max_tokens for n, _, _ in results)
    gaps = [b - a for _, _, ts in results for a, b in itertools.pairwise(ts)]
    steps = s2["steps"] - s0["steps"]
    busy = s2["model_busy_seconds"] - s0["model_busy_seconds"]
    return {
        "streams": args.streams,
        "tokens_each_ok": ok,
        "chunks_per_token": sum(c for _, c, _ in results) / max(1, sum(n for n, _, _ in results)),
        "wall_s": wall,
        "steady_wall_s": time.perf_counter() - t1,
        "steps": steps,
        "steady_steps": s2["steps"] - s1["steps"],
        "model_busy_s": busy,
        "mean_step_ms": 1e3 * busy / steps / args.time_scale if steps else 0.0,
        "client_mean_itl_ms": 1e3 * statistics.fmean(gaps) if gaps else 0.0,
        "admission_lag_p50_ms": 1e3 * s1["lag_p50_seconds"],
        "admission_lag_p99_ms": 1e3 * s1["lag_p99_seconds"],
        "admission_lag_max_ms": 1e3 * s1["lag_max_seconds"],
        "lag_p50_ms": 1e3 * s2["lag_p50_seconds"],
        "lag_p99_ms": 1e3 * s2["lag_p99_seconds"],
        "lag_max_ms": 1e3 * s2["lag_max_seconds"],
        "server_cpu_s": s2["process_cpu_seconds"] - s0["process_cpu_seconds"],
        "client_cpu_s": client_cpu,
        "spin_margin_ms": 1e3 * s2["spin_margin_seconds"],
    }


def _small(args: argparse.Namespace) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(args), "max_tokens": 8, "prompt_words": 8})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--prompt-words", type=int, default=128)
    ap.add_argument("--model", default="Qwen2.5-7B")
    ap.add_argument("--gpu", default="H200-SXM")
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--json", action="store_true", help="print the result as JSON too")
    args = ap.parse_args()
    proc, port = start(args)
    try:
        try:
            import uvloop

            res = uvloop.run(run(args, port))
        except ImportError:
            res = asyncio.run(run(args, port))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    w = res["wall_s"]
    print(
        f"{res['streams']} concurrent streams x {args.max_tokens} tokens, {args.model} on "
        f"{args.gpu}, time-scale {args.time_scale}: {res['steps']} steps in {w:.2f} s "
        f"(model busy {res['model_busy_s']:.2f} s, mean step {res['mean_step_ms']:.2f} ms)"
    )
    print(
        f"lag per step, all {res['streams']} running, from token {args.max_tokens // 8} on "
        f"({res['steady_steps']} steps): "
        f"P50 {res['lag_p50_ms']:.3f} ms  P99 {res['lag_p99_ms']:.3f} ms  "
        f"max {res['lag_max_ms']:.3f} ms  (goal < 1 ms)"
    )
    print(
        f"lag per step before (the {res['streams']} requests arrive and start): "
        f"P50 {res['admission_lag_p50_ms']:.3f} ms  P99 {res['admission_lag_p99_ms']:.3f} ms  "
        f"max {res['admission_lag_max_ms']:.3f} ms"
    )
    print(
        f"CPU: server {res['server_cpu_s']:.2f} s ({100 * res['server_cpu_s'] / w:.0f}% of a core, "
        f"spin margin {res['spin_margin_ms']:.2f} ms/step), client {res['client_cpu_s']:.2f} s "
        f"({100 * res['client_cpu_s'] / w:.0f}% of a core)"
    )
    print(
        f"every stream got its {args.max_tokens} tokens: {res['tokens_each_ok']}; "
        f"{res['chunks_per_token']:.2f} SSE chunks per token (1.00 = one chunk per token; "
        f"less = tokens coalesced while the server is behind); client mean inter-token gap "
        f"{res['client_mean_itl_ms']:.3f} ms"
    )
    if args.json:
        print(json.dumps(res))


if __name__ == "__main__":
    main()
