#!/usr/bin/env python3
# ruff: noqa: SIM115  (short-lived script)
"""Summarise the real-vLLM grid (CPU, stdlib only): reads data/*/grid_summary.json, writes
data/points.csv and prints a markdown table.   python3 benchmarks/real_vllm/summarize.py"""

import csv
import glob
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
COLS = [
    "run",
    "name",
    "input_len",
    "prefix_len",
    "output_len",
    "concurrency",
    "num_prompts",
    "ok",
    "mean_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "p99_tpot_ms",
    "mean_itl_ms",
    "p99_itl_ms",
    "mean_e2el_ms",
    "p99_e2el_ms",
    "output_throughput",
    "request_throughput",
    "duration",
    "preemptions",
    "prefix_cache_hit_tokens",
    "prefix_cache_query_tokens",
    "max_running",
    "max_waiting",
    "max_kv_usage",
    "error",
]


def rows():
    for f in sorted(glob.glob(os.path.join(HERE, "data", "*", "grid_summary.json"))):
        run = os.path.basename(os.path.dirname(f))
        s = json.load(open(f))
        for p in s["points"]:
            if "skipped" in p:
                continue
            r = p.get("result", {})
            md = p.get("metrics_delta", {})
            yield {
                "run": run,
                **{
                    k: p.get(k)
                    for k in (
                        "name",
                        "input_len",
                        "prefix_len",
                        "output_len",
                        "concurrency",
                        "num_prompts",
                        "ok",
                        "max_running",
                        "max_waiting",
                        "max_kv_usage",
                        "error",
                    )
                },
                **{k: r.get(k) for k in COLS if k in r},
                "ok": bool(p.get("ok")) and r.get("completed", 1) > 0,
                "preemptions": md.get("vllm:num_preemptions_total", 0.0),
                "prefix_cache_hit_tokens": md.get("vllm:prefix_cache_hits_total", 0.0),
                "prefix_cache_query_tokens": md.get("vllm:prefix_cache_queries_total", 0.0),
            }


def main():
    rs = list(rows())
    with open(os.path.join(HERE, "data", "points.csv"), "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLS)
        w.writeheader()
        for r in rs:
            w.writerow(
                {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if k in COLS}
            )
    f = lambda v, d=1: "—" if v is None else f"{v:.{d}f}"  # noqa: E731
    print(
        "| point (in/out, conc, prompts) | TTFT mean / P99 ms | TPOT mean / P99 ms | ITL mean / P99 ms "
        "| out tok/s | req/s | preempt | max running | max KV |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rs:
        pre = f"+{r['prefix_len']} shared " if r["prefix_len"] else ""
        head = (
            f"{pre}{r['input_len']}/{r['output_len']}, c={r['concurrency']}, n={r['num_prompts']}"
        )
        if not r["ok"]:
            print(
                f"| {head} | cut at 170 s (no bench result) | | | | | {r['preemptions']:.0f} | {r['max_running']:.0f} "
                f"| {r['max_kv_usage']:.3f} |"
            )
            continue
        print(
            f"| {head} | {f(r['mean_ttft_ms'])} / {f(r['p99_ttft_ms'])} | {f(r['mean_tpot_ms'], 2)} / "
            f"{f(r['p99_tpot_ms'], 2)} | {f(r['mean_itl_ms'], 2)} / {f(r['p99_itl_ms'], 2)} | "
            f"{f(r['output_throughput'], 0)} | {f(r['request_throughput'], 2)} | {r['preemptions']:.0f} | "
            f"{r['max_running']:.0f} | {r['max_kv_usage']:.3f} |"
        )


if __name__ == "__main__":
    main()
