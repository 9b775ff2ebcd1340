"""How close are measured TTFT and ITL to the truth? servefleet's client against GuideLLM.

Starts the exact-timing test server (``servefleet.bench.testserver``: role-only first chunk,
chunks of 1-3 tokens, stalls; it records when it wrote each chunk), then, at 10, 50 and 200
concurrent streams, runs in turn

* servefleet's client (closed loop, in this process), and
* GuideLLM (``guidellm run``, concurrent profile), when it is installed (``--guidellm PATH``:
  its executable; default: ``guidellm`` on PATH, else ``glvenv/bin/guidellm``),

against the same server, and prints each one's excess over the truth: P99(measured) −
P99(true) for TTFT and for ITL (per token for servefleet; per request for GuideLLM, which only
reports a per-request ITL — servefleet's per-request figure is printed too, like for like),
plus servefleet's per-request TTFT error P99 (measured − true, request by request).

    python benchmarks/client_accuracy.py                 # 10, 50, 200 streams
    python benchmarks/client_accuracy.py --streams 10 --requests 300

The goal: at 10 streams, servefleet's TTFT and ITL P99 excess are within 1 ms of the truth on a
machine whose CPUs are not shared with other busy processes (the run prints whether it met it,
and how long the client waited for a CPU). ``tests/test_bench_accuracy.py`` checks only what no
load can break.

GuideLLM needs a tokenizer for its synthetic prompts and the benchmark runs offline, so a small
word-level tokenizer is built locally (with the ``tokenizers``/``transformers`` of GuideLLM's
own environment) and given to it as a local path.
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
import time
import urllib.request
from pathlib import Path

import numpy as np

from servefleet.bench.point import Load, PointSettings
from servefleet.bench.runs import BenchConfig, run_bench
from servefleet.bench.schedule import StopRule
from servefleet.bench.testserver import truth_errors
from servefleet.workload import fixed_workload

SERVER_ARGS = [
    "--ttft",
    "0.02",
    "--itl",
    "0.01",
    "--chunks",
    "1,3,1,2",
    "--stall-every",
    "8",
    "--stall",
    "0.03",
]
OUTPUT_TOKENS = 32
PROMPT_WORDS = 64

TOKENIZER_SCRIPT = r"""
import sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
C, V = "bdfgklmnprstvz", "aeiou"
vocab = {"[UNK]": 0, "[PAD]": 1}
for a in C:
    for b in V:
        for c in C:
            for d in V:
                vocab.setdefault(a + b + c + d, len(vocab))
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tok.decoder = decoders.WordPiece(prefix="##")
PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]").save_pretrained(sys.argv[1])
"""


GOAL_STREAMS = 10
GOAL_EXCESS_S = 0.001
"""The accuracy goal: P99 excess over the truth within this, at ``GOAL_STREAMS`` streams."""


def start_server() -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "servefleet.bench.testserver", "--port", "0", *SERVER_ARGS],
        stdout=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()  # the ready line (the server prints it once listening)
    if "port=" not in line:
        proc.kill()
        raise SystemExit(f"test server did not start: {line!r}")
    return proc, f"http://127.0.0.1:{line.split('port=')[1].split()[0]}"


def _get(url: str):
    return json.loads(urllib.request.urlopen(url, timeout=30).read())


def _reset(url: str) -> None:
    urllib.request.urlopen(
        urllib.request.Request(url + "/truth/reset", method="POST"), timeout=30
    ).read()


def true_per_request(truth: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(TTFT per request, ITL per token, ITL mean per request) of everything served."""
    ttft, itl, mean_itl = [], [], []
    for t in truth.values():
        c = t["chunks"]
        if not c:
            continue
        ttft.append(c[0][0] - t["recv"])
        gaps = [(c[i][0] - c[i - 1][0]) / c[i][1] for i in range(1, len(c)) for _ in range(c[i][1])]
        itl += gaps
        n = sum(k for _, k in c)
        if n > 1:
            mean_itl.append((c[-1][0] - c[0][0]) / (n - 1))
    return np.asarray(ttft), np.asarray(itl), np.asarray(mean_itl)


def p99(a) -> float:
    return float(np.percentile(a, 99)) if len(a) else float("nan")


def run_servefleet(url: str, streams: int, requests: int) -> dict:
    _reset(url)
    cfg = BenchConfig(
        url,
        fixed_workload(PROMPT_WORDS, OUTPUT_TOKENS),
        PointSettings(StopRule(None, requests)),
        [Load(concurrency=streams)],
        scrape=False,
    )
    try:
        import uvloop

        run = uvloop.run(run_bench(cfg))
    except ImportError:
        run = asyncio.run(run_bench(cfg))
    p = run.points[0]
    truth = _get(url + "/truth")
    e = truth_errors(p.records, truth)
    _, _, t_mean = true_per_request(truth)
    ok = [r for r in p.records if r.ok]
    m_mean = [r.tpot for r in ok if r.tpot is not None]
    return {
        "requests": len(ok),
        "ttft_excess_p99": p99(e["ttft_meas"]) - p99(e["ttft_true"]),
        "itl_excess_p99": p99(e["itl_meas"]) - p99(e["itl_true"]),
        "itl_req_excess_p99": p99(m_mean) - p99(t_mean),
        "ttft_err_p99": p99(e["ttft_err"]),
        "client_cpu": p.selfcheck.client_cpu,
        "cpu_wait": p.selfcheck.runqueue_wait or 0.0,
        "bound": p.selfcheck.client_bound,
    }


def find_guidellm(arg: str | None) -> str | None:
    for c in (arg, shutil.which("guidellm"), "glvenv/bin/guidellm"):
        if c and Path(c).exists():
            return c
    return None


def run_guidellm(exe: str, url: str, streams: int, requests: int, tok: Path, work: Path) -> dict:
    _reset(url)
    out = work / f"guidellm-{streams}.json"
    cmd = [
        exe,
        "run",
        "--backend",
        f"kind=openai_http,target={url},model=test-model",
        "--profile",
        f"kind=concurrent,streams={streams}",
        "--constraint",
        f"kind=max_requests,count={requests}",
        "--tokenizer",
        f"kind=hf_auto,model={tok}",
        "--data",
        f"kind=synthetic_text,prompt_tokens={PROMPT_WORDS},output_tokens={OUTPUT_TOKENS}",
        "--output",
        f"kind=json,path={out}",
        "--disable-console",
    ]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if p.returncode != 0 or not out.is_file():
        return {"error": (p.stderr or p.stdout)[-400:]}
    d = json.loads(out.read_text())
    reqs = d["benchmarks"][0]["requests"]["successful"]
    ttft = np.asarray(
        [r["time_to_first_token_ms"] / 1000 for r in reqs if r.get("time_to_first_token_ms")]
    )
    itl = np.asarray(
        [r["inter_token_latency_ms"] / 1000 for r in reqs if r.get("inter_token_latency_ms")]
    )
    t_ttft, _, t_mean = true_per_request(_get(url + "/truth"))
    return {
        "requests": len(reqs),
        "ttft_excess_p99": p99(ttft) - p99(t_ttft),
        "itl_req_excess_p99": p99(itl) - p99(t_mean),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streams", default="10,50,200")
    ap.add_argument(
        "--requests", type=int, default=0, help="per run (default: 30 x streams, >= 300)"
    )
    ap.add_argument("--guidellm", default=None, help="GuideLLM executable")
    a = ap.parse_args()
    streams = [int(x) for x in a.streams.split(",")]
    exe = find_guidellm(a.guidellm)
    proc, url = start_server()
    work = Path(tempfile.mkdtemp(prefix="client-accuracy-"))
    tok = None
    if exe:
        tok = work / "wordtok"
        py = Path(exe).parent / "python"
        r = subprocess.run(
            [str(py), "-c", TOKENIZER_SCRIPT, str(tok)], capture_output=True, text=True
        )
        if r.returncode != 0:
            print(
                f"GuideLLM found at {exe}, but building its local tokenizer failed:\n{r.stderr[-400:]}"
            )
            exe = None
    else:
        print(
            "GuideLLM is not installed (pip install guidellm into a separate venv, e.g. "
            "python3 -m venv glvenv && glvenv/bin/pip install guidellm); "
            "only servefleet's figures are shown."
        )
    print(
        f"server: {url} {' '.join(SERVER_ARGS)}; {PROMPT_WORDS}-word prompts, {OUTPUT_TOKENS} output tokens; "
        f"{os.cpu_count()} CPU(s)"
    )
    print(
        f"{'streams':>7} {'tool':>11} {'requests':>8} {'TTFT P99 excess':>16} {'ITL P99 excess':>15} "
        f"{'ITL/req P99 excess':>19}  notes"
    )
    results = []
    try:
        for s in streams:
            n = a.requests or max(300, 30 * s)
            t0 = time.perf_counter()
            ours = run_servefleet(url, s, n)
            ours["wall"] = time.perf_counter() - t0
            print(
                f"{s:>7} {'servefleet':>11} {ours['requests']:>8} {ours['ttft_excess_p99'] * 1e3:>13.2f} ms "
                f"{ours['itl_excess_p99'] * 1e3:>12.2f} ms {ours['itl_req_excess_p99'] * 1e3:>16.2f} ms  "
                f"per-request TTFT error P99 {ours['ttft_err_p99'] * 1e3:.2f} ms, client CPU {ours['client_cpu']:.0%}, "
                f"waited for a CPU {ours['cpu_wait']:.0%}"
                + (" (client-bound)" if ours["bound"] else ""),
                flush=True,
            )
            theirs = None
            if exe:
                theirs = run_guidellm(exe, url, s, n, tok, work)
                if "error" in theirs:
                    print(f"{s:>7} {'guidellm':>11} failed: {theirs['error']}")
                    theirs = None
                else:
                    print(
                        f"{s:>7} {'guidellm':>11} {theirs['requests']:>8} {theirs['ttft_excess_p99'] * 1e3:>13.2f} ms "
                        f"{'-':>15} {theirs['itl_req_excess_p99'] * 1e3:>16.2f} ms",
                        flush=True,
                    )
            results.append((s, ours, theirs))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)
    print()
    for s, ours, theirs in results:
        line = f"{s} streams: servefleet TTFT P99 excess {ours['ttft_excess_p99'] * 1e3:.2f} ms"
        if theirs:
            ratio = (
                ours["ttft_excess_p99"] / theirs["ttft_excess_p99"]
                if theirs["ttft_excess_p99"] > 0
                else float("nan")
            )
            line += (
                f", GuideLLM {theirs['ttft_excess_p99'] * 1e3:.2f} ms "
                f"(servefleet's is {ratio:.2f} of GuideLLM's)"
            )
        print(line)
        if s == GOAL_STREAMS:
            met = max(abs(ours["ttft_excess_p99"]), abs(ours["itl_excess_p99"])) < GOAL_EXCESS_S
            print(
                f"goal (TTFT and ITL P99 excess within {GOAL_EXCESS_S * 1e3:g} ms at {s} streams): "
                f"{'met' if met else 'NOT met'} (the client waited for a CPU "
                f"{ours['cpu_wait']:.0%} of the time)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
