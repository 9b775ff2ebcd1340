"""A tiny request beside sixteen 8 MB prompts: how long it waits.

Starts two sim-servers (max-model-len 4096) and a gateway on loopback; then, several times:
the tiny request's latency alone (median of 5), and its latency while another process uploads
sixteen 8 MB prompts at once (refused: 413 from their Content-Length, the gateway's body limit
being 2.1 MB for a 4,096-token model). The uploads come from a separate process, so that the
figure is the gateway's delay, not the load generator's own event loop. Prints the machine's
load average with each trial.

    python benchmarks/gateway_big_bodies.py [--trials 5]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import urllib.request

MODEL = "Qwen2.5-7B"
READY = re.compile(rb"ready: listening on http://[^ ]+ port=(\d+)")
UPLOADER = r"""
import asyncio, json, sys, aiohttp
url, n, mb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
big = json.dumps({"model": sys.argv[4], "prompt": "word " * (mb << 18)}).encode()
async def main():
    async with aiohttp.ClientSession() as s:
        async def post():
            async with s.post(url + "/v1/completions", data=big,
                              headers={"Content-Type": "application/json"}) as r:
                return r.status
        print("started", flush=True)
        print(json.dumps(await asyncio.gather(*(post() for _ in range(n)))), flush=True)
asyncio.run(main())
"""


def start(args: list[str]) -> tuple[subprocess.Popen, str]:
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert p.stdout is not None
    for line in p.stdout:
        m = READY.search(line)
        if m:
            return p, f"http://127.0.0.1:{int(m.group(1))}"
    raise SystemExit(f"{args[2]} did not start")


def tiny(url: str) -> float:
    body = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 1}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    t0 = time.monotonic()
    with urllib.request.urlopen(req, timeout=30) as r:
        r.read()
        assert r.status == 200
    return time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--uploads", type=int, default=16)
    ap.add_argument("--mb", type=int, default=8)
    a = ap.parse_args()
    py = sys.executable
    sims = [start([py, "-m", "servefleet.sim.server", "--model", MODEL, "--gpu", "H200-SXM", "--port", "0",
                   "--time-scale", "10", "--startup-time", "0", "--max-model-len", "4096",
                   "--log-level", "warning"]) for _ in range(2)]  # fmt: skip
    gw_args = [py, "-m", "servefleet.gateway", "--port", "0", "--log-level", "warning",
               "--set", "health.interval=0.2", "--set", "health.healthy_threshold=1"]  # fmt: skip
    for _, url in sims:
        gw_args += ["--replica", url]
    gw, url = start(gw_args)
    try:
        while json.load(urllib.request.urlopen(url + "/fleet", timeout=5))["max_model_len"] is None:
            time.sleep(0.1)  # the body limit follows the fleet's max_model_len
        print(
            f"# a tiny request beside {a.uploads} x {a.mb} MB uploads, {os.cpu_count()} CPU cores"
        )
        for trial in range(a.trials):
            alone = sorted(tiny(url) for _ in range(5))[2]
            up = subprocess.Popen([py, "-c", UPLOADER, url, str(a.uploads), str(a.mb), MODEL],
                                  stdout=subprocess.PIPE, text=True)  # fmt: skip
            assert up.stdout is not None
            up.stdout.readline()
            time.sleep(0.05)  # the uploads are under way
            beside = tiny(url)
            statuses = json.loads(up.stdout.readline())
            up.wait()
            print(f"trial {trial + 1}: alone {alone * 1000:.1f} ms, beside the uploads "
                  f"{beside * 1000:.1f} ms; uploads answered {sorted(set(statuses))}; "
                  f"load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    finally:
        for p, _ in [(gw, url), *sims]:
            p.terminate()
            p.wait(10)


if __name__ == "__main__":
    main()
