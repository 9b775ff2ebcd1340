"""What `non_idempotent` buys: the exported nginx.conf in front of two sim-server replicas, one
still loading (it answers 503), with and without `non_idempotent` in `proxy_next_upstream`.

Starts the two replicas and one nginx per variant (all on loopback), sends N chat completions
one after another through each with the official `openai` client (its own retries off, each
request with its own API key), and prints how many were answered 200, and the median and max
time per request (the retried ones pay a 503 round trip to the loading replica). The loading
replica counts the requests it turned away.

Usage: python benchmarks/nginx_loading_replica.py [--requests 20] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import openai

from servefleet.fleet.commands import free_ports
from servefleet.fleet.export import nginx_conf
from servefleet.plan.fleet_yaml import Fleet

READY = re.compile(r"sim-server ready: .* port=(\d+)")


def start(argv: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=open(log, "w"),
        text=True,
        start_new_session=True,
    )


def sim(tmp: Path, name: str, startup: float) -> tuple[subprocess.Popen, int]:
    p = start(
        [sys.executable, "-m", "servefleet.sim.server", "--model", "Qwen2.5-7B",
         "--gpu", "H200-SXM", "--port", "0", "--startup-time", str(startup)],
        tmp / f"{name}.log",
    )  # fmt: skip
    m = READY.search(p.stdout.readline())
    assert m, (tmp / f"{name}.log").read_text()
    return p, int(m.group(1))


def fleet(ports: list[int], listen: int) -> Fleet:
    return Fleet.model_validate(
        {
            "model": {"name": "Qwen2.5-7B", "path": "Qwen/Qwen2.5-7B-Instruct"},
            "engine": "sim",
            "gpus": {"type": "H200-SXM", "count": 2},
            "vllm": {"max_model_len": 4096, "max_num_seqs": 64, "max_num_batched_tokens": 2048},
            "replicas": [
                {"name": f"r{i}", "tp": 1, "gpu_ids": [i], "port": p} for i, p in enumerate(ports)
            ],
            "gateway": {"port": listen},
        }
    )


def run(tmp: Path, conf: str, listen: int, n: int, tag: str) -> tuple[int, list[float]]:
    prefix = tmp / tag
    prefix.mkdir()
    (prefix / "nginx.conf").write_text(conf)
    ng = start(["nginx", "-p", str(prefix), "-c", str(prefix / "nginx.conf"), "-g", "daemon off;"],
               prefix / "stderr.log")  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{listen}/nginx-health", timeout=1)
                break
            except OSError:
                assert time.monotonic() < deadline, (prefix / "stderr.log").read_text()
                time.sleep(0.05)
        ok, times = 0, []
        for i in range(n):
            client = openai.OpenAI(
                base_url=f"http://127.0.0.1:{listen}/v1", api_key=f"{tag}-{i}", max_retries=0
            )
            t0 = time.perf_counter()
            try:
                client.chat.completions.create(
                    model="Qwen2.5-7B",
                    messages=[{"role": "user", "content": "hello there"}],
                    max_tokens=3,
                )
                ok += 1
            except openai.APIStatusError:
                pass
            times.append(time.perf_counter() - t0)
        return ok, times
    finally:
        os.killpg(ng.pid, signal.SIGQUIT)
        ng.wait(10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        procs = []
        try:
            ready, p_ready = sim(tmp, "ready", 0)
            loading, p_loading = sim(tmp, "loading", 3600)
            procs = [ready, loading]
            for r in range(args.rounds):  # interleaved: with, then without, each round
                for variant in ("non_idempotent", "without"):
                    listen = free_ports(1)[0]
                    conf = nginx_conf(fleet([p_ready, p_loading], listen))
                    if variant == "without":
                        conf = conf.replace(" non_idempotent;", ";")
                    ok, times = run(tmp, conf, listen, args.requests, f"{variant}-{r}")
                    print(
                        f"round {r + 1} {variant:>14}: {ok:2d} of {args.requests} answered 200; "
                        f"per request median {statistics.median(times) * 1e3:.1f} ms, "
                        f"max {max(times) * 1e3:.1f} ms"
                    )
            turned_away = (tmp / "loading.log").read_text().count("ServiceUnavailableError")
            print(f"the loading replica answered 503 to {turned_away} attempts in all")
        finally:
            for p in procs:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(10)


if __name__ == "__main__":
    main()
