"""Many connections sending huge request heads: the gateway's memory while they do, and after.

Starts a sim-server and a gateway on loopback (defaults: `server.max_head_bytes` 32 KiB,
`max_connections_per_address` 1024), reads the gateway's RSS (`/proc/PID/status`), then opens
`--connections` connections at once from a separate process, each sending a head of
`--headers` x `--header-bytes` (100 x 7.8 KB: 780 KB) as fast as the gateway reads it. Prints
the peak RSS while they send (sampled every 20 ms), the answers they got (431 expected), and
the RSS once they are all closed, against the baseline. Goal: peak under 300 MB, back within
10 % of the baseline (plus 20 MB) after.

    python benchmarks/gateway_heads.py [--connections 1000]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import threading
import time
import urllib.request

MODEL = "Qwen2.5-7B"
READY = re.compile(rb"ready: listening on http://[^ ]+ port=(\d+)")
SENDER = r"""
import asyncio, collections, json, sys
port, n, count, size = (int(x) for x in sys.argv[1:5])
head = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + b"".join(
    b"X-H%d: %s\r\n" % (i, b"v" * size) for i in range(count)) + b"\r\n"
async def one():
    try:
        r, w = await asyncio.open_connection("127.0.0.1", port)
    except OSError as e:
        return "connect:" + type(e).__name__
    try:
        w.write(head)
        await w.drain()
    except OSError:
        pass
    try:
        line = await asyncio.wait_for(r.readline(), 60)
    except (OSError, TimeoutError) as e:
        line = type(e).__name__.encode()
    w.close()
    parts = line.split(b" ")
    return parts[1].decode() if len(parts) > 1 else (line.decode() or "closed")
async def main():
    got = await asyncio.gather(*(one() for _ in range(n)))
    print(json.dumps(collections.Counter(got)), flush=True)
asyncio.run(main())
"""


def start(args: list[str]) -> tuple[subprocess.Popen, int]:
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert p.stdout is not None
    for line in p.stdout:
        m = READY.search(line)
        if m:
            return p, int(m.group(1))
    raise SystemExit(f"{args[2]} did not start")


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--connections", type=int, default=1000)
    ap.add_argument("--headers", type=int, default=100)
    ap.add_argument("--header-bytes", type=int, default=7800)
    a = ap.parse_args()
    py = sys.executable
    sim, sim_port = start([py, "-m", "servefleet.sim.server", "--model", MODEL, "--gpu", "H200-SXM",
                           "--port", "0", "--startup-time", "0", "--log-level", "warning"])  # fmt: skip
    gw, port = start([py, "-m", "servefleet.gateway", "--port", "0", "--log-level", "warning",
                      "--replica", f"http://127.0.0.1:{sim_port}"])  # fmt: skip
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
                break
            except OSError:
                time.sleep(0.1)
        time.sleep(1.0)  # settle
        base = rss_mb(gw.pid)
        peak = [base]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], rss_mb(gw.pid))
                time.sleep(0.02)

        t = threading.Thread(target=sample, daemon=True)
        t.start()
        t0 = time.monotonic()
        out = subprocess.run(
            [py, "-c", SENDER, str(port), str(a.connections), str(a.headers), str(a.header_bytes)],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        took = time.monotonic() - t0
        done.set()
        t.join()
        answers = json.loads(out.stdout.strip().splitlines()[-1]) if out.stdout.strip() else {}
        time.sleep(2.0)  # connections closed: let the gateway free what they held
        after = rss_mb(gw.pid)
        head_kb = a.headers * a.header_bytes / 1000
        print(f"{a.connections} connections x {head_kb:.0f} KB heads, sent in {took:.2f} s")
        print(f"answers: {answers}")
        print(f"gateway RSS: baseline {base:.1f} MB, peak {peak[0]:.1f} MB, after {after:.1f} MB")
        ok = peak[0] < 300 and after <= base * 1.1 + 20
        print("goal (peak < 300 MB, back to baseline): " + ("met" if ok else "NOT met"))
    finally:
        for p in (gw, sim):
            p.terminate()
            p.wait(10)


if __name__ == "__main__":
    main()
