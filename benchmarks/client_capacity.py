"""The highest request rate one client process sustains with send-schedule lag P99 < 5 ms.

Against a fast local server (``servefleet.bench.testserver --fast``: every token at once, so the
server costs little), open-loop Poisson arrivals are sent at a rate found by doubling, then
bisection (``SloSearch``); a rate "holds" when the lag of actual behind scheduled send times has
P99 < 5 ms and the achieved rate is within 5 % of the offered one. The same search runs, in the
same process run, for GuideLLM (``guidellm run --profile kind=poisson``; its lag is
``request_start − targeted_start``) when it is installed. ``vllm bench serve`` is not run: vLLM
(with torch and CUDA wheels) is not assumed to be installed; where it is installed,
``--vllm`` names its executable.

    python benchmarks/client_capacity.py                       # servefleet, and GuideLLM if found
    python benchmarks/client_capacity.py --seconds 5 --start 100
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from servefleet.bench.point import Load, PointSettings
from servefleet.bench.runs import BenchConfig, run_bench
from servefleet.bench.schedule import StopRule
from servefleet.bench.search import SloSearch
from servefleet.bench.testserver import spawn_test_server
from servefleet.workload import fixed_workload

LAG_LIMIT = 0.005
PROMPT, OUTPUT = 32, 16
SERVER_ARGS = ("--fast", "--no-truth", "--chunks", "4")

sys.path.insert(0, str(Path(__file__).parent))
from client_accuracy import TOKENIZER_SCRIPT, find_guidellm  # noqa: E402


def trial_seconds(rate: float, seconds: float) -> float:
    """Long enough for ~300 sends (a P99 of fewer samples is only their maximum), at most 30 s."""
    return min(max(seconds, 300.0 / rate), 30.0)


def servefleet_trial(url: str, rate: float, seconds: float) -> tuple[bool, dict]:
    cfg = BenchConfig(
        url,
        fixed_workload(PROMPT, OUTPUT),
        PointSettings(StopRule(duration=seconds), warmup=min(1.0, seconds / 5)),
        [Load(rate=rate)],
        scrape=False,
    )
    try:
        import uvloop

        run = uvloop.run(run_bench(cfg))
    except ImportError:
        run = asyncio.run(run_bench(cfg))
    p = run.points[0]
    c = p.selfcheck
    ok = sum(1 for r in p.records if r.ok)
    held = (
        c.send_lag_p99 is not None
        and c.send_lag_p99 < LAG_LIMIT
        and c.achieved_rate >= 0.95 * c.offered_rate
        and ok == len(p.records)
    )
    return held, {
        "lag_p99": c.send_lag_p99,
        "achieved": c.achieved_rate,
        "cpu": c.client_cpu,
        "wait": c.runqueue_wait or 0.0,
        "errors": len(p.records) - ok,
    }


def guidellm_trial(
    exe: str, url: str, rate: float, seconds: float, tok: Path, work: Path
) -> tuple[bool, dict]:
    out = work / f"gl-{rate:g}.json"
    cmd = [
        exe,
        "run",
        "--backend",
        f"kind=openai_http,target={url},model=test-model",
        "--profile",
        f"kind=poisson,rate={rate}",
        "--constraint",
        f"kind=max_duration,seconds={seconds}",
        "--tokenizer",
        f"kind=hf_auto,model={tok}",
        "--data",
        f"kind=synthetic_text,prompt_tokens={PROMPT},output_tokens={OUTPUT}",
        "--output",
        f"kind=json,path={out}",
        "--disable-console",
    ]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if p.returncode != 0 or not out.is_file():
        return False, {"error": (p.stderr or p.stdout)[-300:]}
    b = json.loads(out.read_text())["benchmarks"][0]
    reqs = b["requests"]["successful"]
    errs = len(b["requests"]["errored"]) + len(b["requests"]["incomplete"])
    lags = [
        r["info"]["timings"]["request_start"] - r["info"]["timings"]["targeted_start"]
        for r in reqs
        if r["info"]["timings"].get("targeted_start") and r["info"]["timings"].get("request_start")
    ]
    lags = [x for x in lags if 0 <= x < 600]  # both on the same (epoch) clock
    if not lags:
        return False, {"error": "no request timings"}
    span = max(r["info"]["timings"]["request_start"] for r in reqs) - min(
        r["info"]["timings"]["request_start"] for r in reqs
    )
    achieved = len(reqs) / span if span > 0 else 0.0
    lag = float(np.percentile(lags, 99))
    held = lag < LAG_LIMIT and achieved >= 0.95 * rate and errs == 0
    return held, {"lag_p99": lag, "achieved": achieved, "errors": errs}


def search(name: str, trial, start: float, max_points: int) -> float | None:
    s = SloSearch(start=start, tolerance=0.1, max_points=max_points)
    while (r := s.next_rate()) is not None:
        held, info = trial(r)
        s.report(r, held)
        if "error" in info:
            print(f"  {name:>10} {r:>8.1f} req/s: failed: {info['error']}", flush=True)
            return None
        lag = info["lag_p99"]
        print(
            f"  {name:>10} {r:>8.1f} req/s: lag P99 {lag * 1e3:7.2f} ms, achieved {info['achieved']:8.1f} req/s"
            + (
                f", client CPU {info['cpu']:.0%}, waited for a CPU {info['wait']:.0%}"
                if "cpu" in info
                else ""
            )
            + (f", {info['errors']} errors" if info.get("errors") else "")
            + ("  holds" if held else "  FAILS"),
            flush=True,
        )
    return s.result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=4.0, help="arrivals per trial")
    ap.add_argument("--start", type=float, default=100.0, help="first rate tried (req/s)")
    ap.add_argument("--max-points", type=int, default=9)
    ap.add_argument("--guidellm", default=None, help="GuideLLM executable")
    ap.add_argument("--no-guidellm", action="store_true")
    ap.add_argument(
        "--vllm", default=None, help="`vllm` executable, for `vllm bench serve` (not run here)"
    )
    a = ap.parse_args()
    results = {}
    with spawn_test_server(*SERVER_ARGS) as server:
        print(
            f"fast local server {server.url} ({' '.join(SERVER_ARGS)}); {PROMPT}-token prompts, "
            f"{OUTPUT} output tokens; Poisson arrivals, {a.seconds:g} s per trial; {os.cpu_count()} CPU(s)"
        )
        results["servefleet"] = search(
            "servefleet",
            lambda r: servefleet_trial(server.url, r, trial_seconds(r, a.seconds)),
            a.start,
            a.max_points,
        )
        exe = None if a.no_guidellm else find_guidellm(a.guidellm)
        if exe:
            work = Path(tempfile.mkdtemp(prefix="client-capacity-"))
            tok = work / "wordtok"
            r = subprocess.run(
                [str(Path(exe).parent / "python"), "-c", TOKENIZER_SCRIPT, str(tok)],
                capture_output=True,
                text=True,
            )
            if r.returncode == 0:
                results["guidellm"] = search(
                    "guidellm",
                    lambda rate: guidellm_trial(
                        exe, server.url, rate, trial_seconds(rate, a.seconds), tok, work
                    ),
                    min(a.start, 25.0),
                    a.max_points,
                )
            else:
                print(
                    f"GuideLLM found at {exe}, but its local tokenizer could not be built: {r.stderr[-300:]}"
                )
            shutil.rmtree(work, ignore_errors=True)
        elif not a.no_guidellm:
            print(
                "GuideLLM is not installed (python3 -m venv glvenv && glvenv/bin/pip install "
                "guidellm): its figure is missing."
            )
    print(
        "vllm bench serve: not run — vLLM is too heavy to install on this machine"
        + (f" (given {a.vllm}, but this script does not drive it yet)" if a.vllm else "")
        + "."
    )
    print()
    ours = results.get("servefleet")
    print(
        f"servefleet: {ours:.0f} req/s with send-schedule lag P99 < 5 ms"
        if ours
        else "servefleet: no rate held"
    )
    theirs = results.get("guidellm")
    if "guidellm" in results:
        print(
            f"GuideLLM:   {theirs:.0f} req/s with send-schedule lag P99 < 5 ms"
            if theirs
            else "GuideLLM:   no rate held"
        )
        if ours and theirs:
            print(f"ratio servefleet / GuideLLM: {ours / theirs:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
