"""Soak: does any process of a fleet grow while the load stays the same?

Starts ``--replicas`` sim-servers, one gateway in front of them, and one ``servefleet bench``
process that sends a steady open-loop load (``--rate`` req/s of fixed-length streams) through
the gateway for ``--minutes``; meanwhile it samples every process's resident memory (RSS,
``/proc/PID/status``) and open file descriptors (``/proc/PID/fd``) every ``--interval`` seconds.
After the warm-up (``--warmup`` minutes; default a sixth of the run, at most 5 minutes) it fits
a least-squares line to each series and prints its slope in % of the series' mean per 10
minutes, with the start and end values. Goal: every fleet process (replicas and gateway) under
1 % per 10 minutes for RSS, and its open FDs flat. The bench client keeps every record of its
run in memory, so its own RSS grows by design (shown, not judged).

A replica's prefix-cache index grows until every KV block holds a cached prefix (then blocks are
evicted): bounded by the cache's size, as in vLLM, but with the full 129,030 blocks of a 7B on
an H200 that takes ~7,000 distinct requests. The replicas therefore run with a small cache
(``--gpu-memory-utilization``, default 0.13: 3,052 blocks, full after ~150 requests), so that
it is full before the warm-up ends and the slope after it shows any growth beyond that bound.

Every process runs on this machine over loopback; the load stops by itself after ``--minutes``.

    python benchmarks/soak.py                    # 30 minutes, the figure to judge
    python benchmarks/soak.py --minutes 3        # a short check (slopes are noisier)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from procs import stop, wait_port

GOAL_RSS = 1.0
"""% per 10 minutes."""


@dataclass
class Proc:
    name: str
    args: list[str]
    judged: bool = True
    p: subprocess.Popen | None = None
    port: int | None = None
    samples: list[tuple[float, float, int]] = field(default_factory=list)
    """(seconds since the load began, RSS MiB, open FDs) of the process and its children."""

    def start(self, ready: bool = True, timeout: float = 120) -> Proc:
        self.err = tempfile.TemporaryFile()  # noqa: SIM115 (read back on failure)
        self.p = subprocess.Popen(
            self.args, stdout=subprocess.PIPE, stderr=self.err, stdin=subprocess.DEVNULL
        )
        if ready:
            self.port = wait_port(self.p, self.err, self.name, timeout)
        return self

    def stderr(self) -> str:
        self.err.seek(0)
        return self.err.read().decode(errors="replace")

    def sample(self, t: float) -> None:
        assert self.p is not None
        rss, fds = 0.0, 0
        for pid in (self.p.pid, *_descendants(self.p.pid)):
            try:
                status = Path(f"/proc/{pid}/status").read_text()
                rss += int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]
                fds += len(os.listdir(f"/proc/{pid}/fd"))
            except (OSError, AttributeError):
                continue
        if rss:
            self.samples.append((t, rss, fds))

    def stop(self) -> None:
        if self.p is not None:
            stop(self.p, 20)


def _descendants(pid: int) -> list[int]:
    out: list[int] = []
    try:
        kids = [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return out
    for k in kids:
        out += [k, *_descendants(k)]
    return out


def slope_pct(t: np.ndarray, y: np.ndarray) -> float:
    """Least-squares slope of ``y`` over ``t`` (s), in % of the mean of ``y`` per 10 minutes."""
    if len(t) < 3 or not y.mean():
        return float("nan")
    return float(np.polyfit(t, y, 1)[0] * 600 / y.mean() * 100)


def report(procs: list[Proc], warmup_s: float) -> tuple[list[dict], bool]:
    rows, ok = [], True
    for pr in procs:
        s = np.array([x for x in pr.samples if x[0] >= warmup_s])
        if len(s) < 3:
            rows.append({"process": pr.name, "samples": len(s)})
            ok = False
            continue
        t, rss, fds = s[:, 0], s[:, 1], s[:, 2]
        row = {
            "process": pr.name,
            "samples": len(s),
            "rss_mib_start": round(float(rss[0]), 1),
            "rss_mib_end": round(float(rss[-1]), 1),
            "rss_slope_pct_per_10min": round(slope_pct(t, rss), 2),
            "fds_start": int(fds[0]),
            "fds_end": int(fds[-1]),
            "fds_slope_pct_per_10min": round(slope_pct(t, fds), 2),
            "judged": pr.judged,
        }
        if pr.judged and not abs(row["rss_slope_pct_per_10min"]) < GOAL_RSS:
            ok = False
        rows.append(row)
    return rows, ok


def bench_outcome(out: Path) -> str:
    try:
        summary = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        return "no summary written"
    points = summary.get("points") or []
    if not points:
        return "no point"
    s = points[0].get("summary", points[0])
    n, good = s.get("num_requests"), s.get("num_ok")
    if n is None:
        return json.dumps(s)[:200]
    return f"{n} requests, {n - (good or 0)} failed {s.get('errors') or ''}".rstrip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30.0, help="Length of the load (default 30).")
    ap.add_argument(
        "--warmup",
        type=float,
        help="Minutes left out of the slopes at the start (default: a sixth of --minutes, at "
        "most 5).",
    )
    ap.add_argument("--replicas", type=int, default=2, help="Sim-server replicas (default 2).")
    ap.add_argument("--rate", type=float, default=4.0, help="Requests per second (default 4).")
    ap.add_argument("--input-len", type=int, default=256, help="Prompt tokens (default 256).")
    ap.add_argument("--output-len", type=int, default=64, help="Output tokens (default 64).")
    ap.add_argument("--model", default="Qwen2.5-7B", help="Sim-server model (default Qwen2.5-7B).")
    ap.add_argument("--gpu", default="H200-SXM", help="Sim-server GPU (default H200-SXM).")
    ap.add_argument(
        "--gpu-memory-utilization",
        default="0.13",
        help="The replicas' (default 0.13: a KV cache that fills before the warm-up ends).",
    )
    ap.add_argument(
        "--interval", type=float, default=5.0, help="Seconds between samples (default 5)."
    )
    ap.add_argument("--json", type=Path, help="Also write the rows and every sample here.")
    args = ap.parse_args()
    warmup = args.warmup if args.warmup is not None else min(5.0, args.minutes / 6)
    py = sys.executable
    workdir = Path(tempfile.mkdtemp(prefix="soak-"))
    procs: list[Proc] = []
    try:
        for i in range(args.replicas):
            procs.append(
                Proc(
                    f"replica-{i}",
                    [
                        py,
                        "-m",
                        "servefleet.sim.server",
                        "--model",
                        args.model,
                        "--gpu",
                        args.gpu,
                        "--startup-time",
                        "0",
                        "--port",
                        "0",
                        "--disable-log-requests",
                        "--log-level",
                        "warning",
                        "--seed",
                        str(i),
                        "--gpu-memory-utilization",
                        args.gpu_memory_utilization,
                    ],
                ).start()
            )
        gw = [py, "-m", "servefleet.gateway", "--port", "0", "--log-level", "warning",
              "--set", "health.interval=1", "--set", "health.healthy_threshold=1"]  # fmt: skip
        for r in procs:
            gw += ["--replica", f"http://127.0.0.1:{r.port}"]
        procs.append(Proc("gateway", gw).start())
        url = f"http://127.0.0.1:{procs[-1].port}"
        _wait_ready(url, args.replicas)
        bench = Proc(
            "bench client",
            [
                py,
                "-m",
                "servefleet.cli",
                "bench",
                "--url",
                url,
                "--endpoint",
                "completions",
                "--input-len",
                str(args.input_len),
                "--output-len",
                str(args.output_len),
                "--rate",
                str(args.rate),
                "--duration",
                str(args.minutes * 60),
                "--warmup",
                "0",
                "--cooldown",
                "0",
                "--no-whole-burst-periods",
                "--no-progress",
                "--out",
                str(workdir / "bench"),
            ],
            judged=False,
        ).start(ready=False)
        procs.append(bench)
        print(
            f"soak: {args.replicas} replicas + gateway at {url}, {args.rate:g} req/s of "
            f"{args.input_len}/{args.output_len}-token streams for {args.minutes:g} min "
            f"(warm-up {warmup:g} min), sampling every {args.interval:g} s",
            flush=True,
        )
        t0 = time.monotonic()
        end = t0 + args.minutes * 60
        next_print = t0 + 60
        while time.monotonic() < end and bench.p is not None and bench.p.poll() is None:
            now = time.monotonic()
            for pr in procs:
                pr.sample(now - t0)
            for pr in procs[:-1]:
                assert pr.p is not None
                if pr.p.poll() is not None:
                    raise SystemExit(f"{pr.name} exited: {pr.stderr()[-2000:]}")
            if now >= next_print:
                line = ", ".join(
                    f"{pr.name} {pr.samples[-1][1]:.0f} MiB/{pr.samples[-1][2]} fds"
                    for pr in procs
                    if pr.samples
                )
                print(f"  {(now - t0) / 60:5.1f} min: {line}", flush=True)
                next_print += 60
            time.sleep(max(0.0, min(args.interval, end - time.monotonic())))
        assert bench.p is not None
        try:
            bench.p.wait(args.minutes * 60 + 120 - (time.monotonic() - t0))
        except subprocess.TimeoutExpired:
            bench.stop()
        rows, ok = report(procs, warmup * 60)
    finally:
        for pr in reversed(procs):
            pr.stop()
    print(f"\nload: {bench_outcome(workdir / 'bench')} (bench exit {bench.p.returncode})")
    print(
        f"{'process':<14} {'RSS MiB start→end':>18} {'RSS %/10min':>12} "
        f"{'FDs start→end':>14} {'FDs %/10min':>12}"
    )
    for r in rows:
        if "rss_slope_pct_per_10min" not in r:
            print(f"{r['process']:<14} too few samples after the warm-up ({r['samples']})")
            continue
        mark = (
            ""
            if not r["judged"]
            else "  ok"
            if abs(r["rss_slope_pct_per_10min"]) < GOAL_RSS
            else "  MISS"
        )
        print(
            f"{r['process']:<14} {r['rss_mib_start']:>8.1f} → {r['rss_mib_end']:<7.1f} "
            f"{r['rss_slope_pct_per_10min']:>+11.2f}% {r['fds_start']:>6} → {r['fds_end']:<5} "
            f"{r['fds_slope_pct_per_10min']:>+11.2f}%{mark}"
        )
    print(
        f"goal: every replica's and the gateway's RSS slope under {GOAL_RSS:g} % per 10 min "
        f"after the warm-up: {'PASS' if ok else 'MISS'}"
    )
    if args.json:
        args.json.write_text(
            json.dumps({"rows": rows, "samples": {p.name: p.samples for p in procs}}, indent=1)
        )
    return 0 if ok else 1


def _wait_ready(url: str, n: int, timeout: float = 60) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/ready", timeout=2) as r:
                if len(json.loads(r.read()).get("ready_replicas", [])) == n:
                    return
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    raise SystemExit("the gateway did not get ready")


if __name__ == "__main__":
    sys.exit(main())
