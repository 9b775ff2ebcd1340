"""What the gateway costs: added latency and streaming throughput, against Nginx, in one run.

Starts sim-server replicas, one gateway process (``python -m servefleet.gateway``) and one
Nginx (a plain reverse proxy to the same replicas: one worker, upstream keep-alive,
``proxy_buffering off``; its config is written to a temporary folder), all on loopback, then:

1. latency at ``--concurrency`` (200) concurrent streams, closed loop: TTFT and E2E P50/P99
   straight to the replicas (the client spreads requests itself), through the gateway and
   through Nginx; "added" is a target's percentile minus the direct one (targets: gateway
   added P99 <= 2 ms);
2. streaming throughput: many long streams on fast replicas; output tokens/s that reach the
   client, and the proxy's CPU seconds (from /proc), so tokens per proxy CPU-second is the
   throughput per core (target: the gateway >= half of Nginx's);
3. ``--max-streams`` (2,000) concurrent streams through the gateway: every one must finish
   with all its tokens and no error.

The figures are printed as measured, with a PASS/MISS per target. The load generator, the
replicas and the proxies share this machine's cores: on a small machine the client and the
replicas compete with the proxy, which shows up in the latency figures (the report says how
many cores there were). Usage: python benchmarks/gateway_overhead.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import numpy as np

from procs import stop, wait_port

MODEL = "test-model"  # what servefleet.bench.testserver serves


# -- processes -------------------------------------------------------------------------------
class Proc:
    def __init__(self, args: list[str], name: str, ready: bool = True, timeout: float = 60) -> None:
        self.name = name
        self.err = tempfile.TemporaryFile()  # noqa: SIM115 (kept for the error message)
        self.p = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=self.err, stdin=subprocess.DEVNULL
        )
        self.port = wait_port(self.p, self.err, name, timeout) if ready else None

    def cpu_seconds(self) -> float:
        """utime + stime of the process (and its children: Nginx's worker)."""
        total = 0.0
        tick = os.sysconf("SC_CLK_TCK")
        pids = [self.p.pid, *_children(self.p.pid)]
        for pid in pids:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / tick
            except (OSError, IndexError, ValueError):
                pass
        return total

    def renice(self, nice: int) -> None:
        """Scheduling priority of the process and its children (Nginx's worker)."""
        for pid in (self.p.pid, *_children(self.p.pid)):
            os.setpriority(os.PRIO_PROCESS, pid, nice)

    def stop(self) -> None:
        stop(self.p, 15)


def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_servers(n: int, ttft: float, itl: float) -> list[Proc]:
    """Replicas with exactly known token times (``servefleet.bench.testserver``): the first
    text ``ttft`` s after the request, then one token every ``itl`` s, one token a chunk."""
    return [
        Proc(
            [
                sys.executable,
                "-m",
                "servefleet.bench.testserver",
                "--port",
                "0",
                "--ttft",
                str(ttft),
                "--itl",
                str(itl),
                "--chunks",
                "1",
                "--no-truth",
            ],
            "testserver",
        )
        for _ in range(n)
    ]


def start_gateway(urls: list[str], extra: list[str] = ()) -> Proc:
    args = [sys.executable, "-m", "servefleet.gateway", "--port", "0", "--log-level", "warning", *extra,
            "--policy", "least-outstanding", "--set", "health.interval=1", "--set", "health.healthy_threshold=1",
            "--set", "admission.max_concurrency=100000", "--set", "admission.max_queue=100000"]  # fmt: skip
    for u in urls:
        args += ["--replica", u]
    return Proc(args, "gateway")


NGINX_CONF = """
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
worker_rlimit_nofile 20000;
events {{ worker_connections 16000; multi_accept on; }}
http {{
  access_log off;
  client_body_temp_path {dir}/body; proxy_temp_path {dir}/proxy;
  fastcgi_temp_path {dir}/fcgi; uwsgi_temp_path {dir}/uwsgi; scgi_temp_path {dir}/scgi;
  upstream replicas {{ least_conn; {servers} keepalive 1024; }}
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    keepalive_requests 100000;
    location / {{
      proxy_pass http://replicas;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
      proxy_read_timeout 300s;
    }}
  }}
}}
"""


def start_nginx(urls: list[str], workdir: Path) -> Proc:
    exe = shutil.which("nginx") or "/usr/sbin/nginx"
    port = free_port()
    servers = " ".join(f"server {u.split('//')[1]};" for u in urls)
    conf = workdir / "nginx.conf"
    conf.write_text(NGINX_CONF.format(dir=workdir, servers=servers, port=port))
    p = Proc(
        [exe, "-c", str(conf), "-p", str(workdir), "-e", str(workdir / "error.log")],
        "nginx",
        ready=False,
    )
    p.port = port
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # ready when it answers /health through the upstream
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                if s.recv(64).startswith(b"HTTP/1.1 200"):
                    return p
        except OSError:
            if p.p.poll() is not None:
                raise SystemExit(
                    f"nginx exited: {(workdir / 'error.log').read_text()[-2000:]}"
                ) from None
        time.sleep(0.05)
    raise SystemExit("nginx did not answer /health")


async def wait_gateway_ready(url: str, n: int) -> None:
    async with aiohttp.ClientSession() as s:
        for _ in range(200):
            async with s.get(url + "/ready") as r:
                if r.status == 200 and len((await r.json())["ready_replicas"]) == n:
                    return
            await asyncio.sleep(0.05)
    raise SystemExit("the gateway did not get ready")


# -- load ------------------------------------------------------------------------------------
@dataclass
class Run:
    ttft: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    tokens: int = 0
    errors: list[str] = field(default_factory=list)
    wall: float = 0.0
    proxy_cpu: float | None = None


async def one_stream(s: aiohttp.ClientSession, url: str, body: bytes, run: Run, want: int) -> None:
    t0 = time.perf_counter()
    ttft = None
    tail = b""
    try:
        async with s.post(
            url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
        ) as r:
            if r.status != 200:
                run.errors.append(f"HTTP {r.status}: {(await r.read())[:200]!r}")
                return
            async for chunk in r.content.iter_any():
                if ttft is None and b'"text"' in chunk:
                    ttft = time.perf_counter() - t0
                tail = (tail + chunk)[-600:]
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        run.errors.append(f"{type(exc).__name__}: {exc}")
        return
    e2e = time.perf_counter() - t0
    m = re.search(rb'"completion_tokens": ?(\d+)', tail)
    n = int(m.group(1)) if m else 0
    if n != want or not tail.rstrip().endswith(b"data: [DONE]"):
        run.errors.append(f"incomplete stream: {n} of {want} tokens")
        return
    run.tokens += n
    run.ttft.append(ttft if ttft is not None else e2e)
    run.e2e.append(e2e)


async def closed_loop(
    urls: list[str], concurrency: int, total: int, max_tokens: int, proxy: Proc | None
) -> Run:
    run = Run()
    body = json.dumps({"model": MODEL, "prompt": "tell me about the sea " * 8, "max_tokens": max_tokens,
                       "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}).encode()  # fmt: skip
    left = [total]
    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=600)
    cpu0 = proxy.cpu_seconds() if proxy else None
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as s:

        async def user(u: int) -> None:
            i = u
            while left[0] > 0:
                left[0] -= 1
                await one_stream(s, urls[i % len(urls)], body, run, max_tokens)
                i += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(user(u) for u in range(concurrency)))
        run.wall = time.perf_counter() - t0
    if proxy is not None:
        run.proxy_cpu = proxy.cpu_seconds() - cpu0
    return run


async def open_loop(
    urls: list[str], rate: float, total: int, max_tokens: int, proxy: Proc | None, seed: int
) -> Run:
    """``total`` streams sent at Poisson times (``rate`` per second, seeded: the same schedule
    for every target), whatever the answers' pace: no closed-loop lock-step with the
    replicas' engine steps."""
    run = Run()
    body = json.dumps({"model": MODEL, "prompt": "tell me about the sea " * 8, "max_tokens": max_tokens,
                       "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}).encode()  # fmt: skip
    send_at = np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate, total))
    conn = aiohttp.TCPConnector(limit=0)
    cpu0 = proxy.cpu_seconds() if proxy else None
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=600)) as s:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        tasks = []
        for i, t in enumerate(send_at):
            delay = t0 + t - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(
                asyncio.create_task(one_stream(s, urls[i % len(urls)], body, run, max_tokens))
            )
        await asyncio.gather(*tasks)
        run.wall = loop.time() - t0
    if proxy is not None:
        run.proxy_cpu = proxy.cpu_seconds() - cpu0
    return run


def load_line() -> str:
    a, b, c = os.getloadavg()
    return f"machine load average {a:.2f} {b:.2f} {c:.2f} ({os.cpu_count()} cores)"


def cpu_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    f = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = f[3] + f[4]
    return sum(f) - idle, sum(f)


def pct(xs: list[float], p: float) -> float:
    return float(np.percentile(np.asarray(xs), p)) if xs else float("nan")


def ms(x: float) -> str:
    return f"{x * 1000:8.2f}"


# -- the benchmark ----------------------------------------------------------------------------
async def bench(args: argparse.Namespace) -> int:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # children inherit it
    workdir = Path(tempfile.mkdtemp(prefix="gw-bench-"))
    procs: list[Proc] = []
    ok = True
    try:
        print(f"# gateway overhead benchmark — {os.cpu_count()} CPU cores, all on loopback; "
              f"Nginx {subprocess.run(['nginx', '-v'], capture_output=True, text=True).stderr.strip().split('/')[-1]}")  # fmt: skip
        if "latency" in args.phases:
            ok &= await latency_phase(args, workdir, procs)
        if "throughput" in args.phases or "streams" in args.phases:
            ok &= await throughput_phases(args, workdir, procs)
    finally:
        for p in procs:
            p.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if ok else 1


async def latency_phase(args: argparse.Namespace, workdir: Path, procs: list[Proc]) -> bool:
    """Phase 1; True when the target is met."""
    reps = test_servers(args.replicas, args.ttft, args.itl)
    procs += reps
    urls = [f"http://127.0.0.1:{r.port}" for r in reps]
    gw = start_gateway(urls, args.gateway_arg)
    ngx = start_nginx(urls, workdir)
    procs += [gw, ngx]
    if args.proxy_nice:
        gw.renice(args.proxy_nice)
        ngx.renice(args.proxy_nice)
    gw_url, ngx_url = f"http://127.0.0.1:{gw.port}", f"http://127.0.0.1:{ngx.port}"
    await wait_gateway_ready(gw_url, len(urls))
    print(load_line() + (f"; both proxies at nice {args.proxy_nice}" if args.proxy_nice else ""))
    c, n, mt = args.concurrency, args.requests, args.max_tokens
    print(f"\n## 1. latency: about {c} concurrent streams, {n} requests x {mt} tokens per target, "
          f"{args.replicas} replicas with exact timing (TTFT {args.ttft * 1000:g} ms, a token every "
          f"{args.itl * 1000:g} ms)")  # fmt: skip
    warm = await closed_loop(urls, c, 2 * c, mt, None)  # warm-up, and the pace of a stream
    await closed_loop([gw_url], c, c, mt, None)
    await closed_loop([ngx_url], c, c, mt, None)
    rate = c / pct(warm.e2e, 50)
    print(f"open loop: Poisson arrivals at {rate:.1f} streams/s (= {c} / the direct E2E P50, so about "
          f"{c} streams at once), one seeded schedule for every target, {args.rounds} interleaved rounds")  # fmt: skip
    runs: dict[str, Run] = {}
    busy: dict[str, list[float]] = {}
    for rnd in range(args.rounds):  # interleaved, so that drift hits all three alike
        for name, target, proxy in (
            ("direct", urls, None),
            ("gateway", [gw_url], gw),
            ("nginx", [ngx_url], ngx),
            ("direct-2", urls, None),
        ):
            b0, t0 = cpu_busy()
            r = await open_loop(target, rate, n // args.rounds, mt, proxy, seed=rnd)
            b1, t1 = cpu_busy()
            busy.setdefault(name, []).append((b1 - b0) / max(1.0, t1 - t0))
            agg = runs.setdefault(name, Run())
            agg.ttft += r.ttft
            agg.e2e += r.e2e
            agg.errors += r.errors
            agg.tokens += r.tokens
            agg.wall += r.wall
            agg.proxy_cpu = (agg.proxy_cpu or 0.0) + (r.proxy_cpu or 0.0)
    d = runs["direct"]
    print(f"{'target':8} {'TTFT P50':>9} {'TTFT P99':>9} {'E2E P50':>9} {'E2E P99':>9}   "
          f"{'+TTFT P50':>9} {'+TTFT P99':>9} {'+E2E P50':>9} {'+E2E P99':>9}  (ms)  errors")  # fmt: skip
    for name, r in runs.items():
        vals = [pct(r.ttft, 50), pct(r.ttft, 99), pct(r.e2e, 50), pct(r.e2e, 99)]
        base = [pct(d.ttft, 50), pct(d.ttft, 99), pct(d.e2e, 50), pct(d.e2e, 99)]
        added = (
            "".join(ms(v - b) + " " for v, b in zip(vals, base, strict=True))
            if name != "direct"
            else " " * 40
        )
        load = f"machine CPU busy {100 * float(np.mean(busy[name])):.0f}%"
        print(
            f"{name:8} {''.join(ms(v) + ' ' for v in vals)}  {added}      {len(r.errors)}   {load}"
        )
    g, d2 = runs["gateway"], runs["direct-2"]
    added_p99 = max(pct(g.ttft, 99) - pct(d.ttft, 99), pct(g.e2e, 99) - pct(d.e2e, 99))
    noise = max(abs(pct(d2.ttft, 99) - pct(d.ttft, 99)), abs(pct(d2.e2e, 99) - pct(d.e2e, 99)))
    print(
        f"noise floor (direct-2 against direct, the same traffic twice): {noise * 1000:.2f} ms at P99"
    )
    print(load_line())
    verdict = "PASS" if added_p99 <= 0.002 else "MISS"
    print(
        f"target: gateway added P99 <= 2 ms at {c} streams: {added_p99 * 1000:.2f} ms -> {verdict}"
    )
    for p in (gw, ngx, *reps):
        p.stop()
    procs.clear()
    return verdict == "PASS"


async def throughput_phases(args: argparse.Namespace, workdir: Path, procs: list[Proc]) -> bool:
    """Phases 2 and 3; True when their targets are met."""
    ok = True
    reps = test_servers(args.replicas, 0.0, args.throughput_itl)
    procs += reps
    urls = [f"http://127.0.0.1:{r.port}" for r in reps]
    gw = start_gateway(urls, args.gateway_arg)
    ngx = start_nginx(urls, workdir)
    procs += [gw, ngx]
    if args.proxy_nice:
        gw.renice(args.proxy_nice)
        ngx.renice(args.proxy_nice)
    gw_url, ngx_url = f"http://127.0.0.1:{gw.port}", f"http://127.0.0.1:{ngx.port}"
    await wait_gateway_ready(gw_url, len(urls))
    if "throughput" in args.phases:
        tc, tn, tmt = args.throughput_concurrency, args.throughput_requests, args.throughput_tokens
        print(f"\n## 2. streaming throughput: {tc} concurrent streams, {tn} requests x {tmt} tokens, "
              f"{args.replicas} replicas sending a token every {args.throughput_itl * 1000:g} ms per stream")  # fmt: skip
        print(
            f"{'target':8} {'tokens/s':>10} {'proxy CPU s':>12} {'tokens per proxy CPU-s':>24}  errors"
        )
        per_core = {}
        for name, target, proxy in (
            ("direct", urls, None),
            ("gateway", [gw_url], gw),
            ("nginx", [ngx_url], ngx),
        ):
            await closed_loop(target, tc, tc, 16, None)
            r = await closed_loop(target, tc, tn, tmt, proxy)
            rate = r.tokens / r.wall
            cpu = r.proxy_cpu
            per_core[name] = r.tokens / cpu if cpu else None
            cpu_s = f"{cpu:12.2f}" if cpu is not None else f"{'-':>12}"
            pc = f"{per_core[name]:24,.0f}" if per_core[name] else f"{'-':>24}"
            print(f"{name:8} {rate:10,.0f} {cpu_s} {pc}  {len(r.errors)}")
        ratio = (
            per_core["gateway"] / per_core["nginx"]
            if per_core.get("nginx") and per_core.get("gateway")
            else 0.0
        )
        verdict = "PASS" if ratio >= 0.5 else "MISS"
        ok &= verdict == "PASS"
        print(
            f"target: gateway >= 0.5 x Nginx's streaming throughput per core: {ratio:.2f} x -> {verdict}"
        )

    if "streams" in args.phases:
        ms_ = args.max_streams
        print(
            f"\n## 3. {ms_} concurrent streams through the gateway ({args.max_streams_tokens} tokens each)"
        )
        r = await closed_loop([gw_url], ms_, ms_, args.max_streams_tokens, gw)
        verdict = "PASS" if not r.errors and len(r.e2e) == ms_ else "MISS"
        ok &= verdict == "PASS"
        print(f"finished {len(r.e2e)} of {ms_}, errors {len(r.errors)}, E2E P99 {pct(r.e2e, 99):.2f} s, "
              f"{r.tokens / r.wall:,.0f} tokens/s -> {verdict}")  # fmt: skip
        for e in sorted(set(r.errors))[:5]:
            print("  error:", e)
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=200)
    ap.add_argument("--requests", type=int, default=800, help="per target, latency phase")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--ttft", type=float, default=0.05, help="replicas' TTFT, latency phase (s)")
    ap.add_argument(
        "--itl", type=float, default=0.05, help="replicas' token interval, latency phase (s)"
    )
    ap.add_argument("--throughput-concurrency", type=int, default=256)
    ap.add_argument("--throughput-requests", type=int, default=1024)
    ap.add_argument("--throughput-tokens", type=int, default=200)
    ap.add_argument(
        "--throughput-itl", type=float, default=0.004, help="replicas' token interval (s)"
    )
    ap.add_argument("--max-streams", type=int, default=2000)
    ap.add_argument("--max-streams-tokens", type=int, default=64)
    ap.add_argument("--quick", action="store_true", help="smaller runs (a smoke test)")
    ap.add_argument(
        "--proxy-nice",
        type=int,
        default=0,
        help="run the gateway and Nginx at this nice value (e.g. -10, as root): the proxies "
        "then get a CPU before the load generator and the replicas, as on a host of their own",
    )
    ap.add_argument(
        "--gateway-arg",
        action="append",
        default=[],
        help="extra argument for the gateway (repeatable), e.g. --gateway-arg=--workers=2",
    )
    ap.add_argument("--phases", default="latency,throughput,streams", help="comma-separated subset")
    args = ap.parse_args()
    args.phases = set(args.phases.split(","))
    if args.quick:
        args.requests, args.rounds, args.throughput_requests, args.max_streams = 400, 2, 256, 500
    try:
        import uvloop

        rc = uvloop.run(bench(args))
    except ImportError:
        rc = asyncio.run(bench(args))
    sys.exit(rc)


if __name__ == "__main__":
    main()
