#!/usr/bin/env python3
# ruff: noqa: SIM115, SIM108, SIM105  (short-lived device script)
"""Device-side driver for the real-vLLM grid: runs `vllm bench serve` points in ONE process (no
re-import per point) against a server that is already healthy, scrapes /metrics before and after
every point (raw text kept), samples the gauges once a second during each point, and writes:

  <raw>/point_<name>.json     the bench-serve result (detailed: per-request ttft/itl/e2e; no texts)
  <raw>/metrics_<name>_{before,after}.txt
  <out>/grid_summary.json     per point: bench metrics, /metrics deltas, gauge samples, timings

Called by run_grid.sh with PYTHONPATH pointing at the unpacked vLLM payload.
"""

import argparse
import asyncio
import json
import math
import os
import re
import threading
import time
import traceback
import urllib.request

T0 = time.time()


def log(*a):
    print(f"[grid {time.time() - T0:6.1f}s]", *a, flush=True)


def scrape(base):
    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        return r.read().decode()


LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfNa]+)$")


def parse_metrics(text):
    """{name{labels}: value} for vllm:* samples (labels without model_name/engine kept verbatim)."""
    out = {}
    for ln in text.splitlines():
        if not ln.startswith("vllm:"):
            continue
        m = LINE.match(ln.strip())
        if m:
            lab = m.group(2) or ""
            lab = (
                re.sub(r'(engine|model_name)="[^"]*",?', "", lab)
                .replace("{}", "")
                .replace(",}", "}")
            )
            try:
                out[m.group(1) + lab] = float(m.group(3))
            except ValueError:
                pass
    return out


COUNTER_KEYS = (
    "num_preemptions_total",
    "prompt_tokens_total",
    "generation_tokens_total",
    "prefix_cache_queries_total",
    "prefix_cache_hits_total",
    "prompt_tokens_cached_total",
    "request_success_total",
    "_sum",
    "_count",
    "iteration_tokens_total_bucket",
)


def deltas(before, after):
    d = {}
    for k, v in after.items():
        if any(s in k for s in COUNTER_KEYS) and "_created" not in k:
            dv = v - before.get(k, 0.0)
            if dv:
                d[k] = dv
    return d


GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")


class Sampler(threading.Thread):
    def __init__(self, base, period=1.0):
        super().__init__(daemon=True)
        self.base, self.period, self.samples, self.stop_ev = base, period, [], threading.Event()

    def run(self):
        while not self.stop_ev.is_set():
            try:
                m = parse_metrics(scrape(self.base))
                s = {"t": round(time.time() - T0, 2)}
                for g in GAUGES:
                    s[g.split(":")[1]] = m.get(g)
                s["preemptions"] = m.get("vllm:num_preemptions_total")
                self.samples.append(s)
            except Exception:
                pass
            self.stop_ev.wait(self.period)


def kv_capacity(server_log):
    txt = open(server_log, errors="replace").read()
    m = re.findall(r"GPU KV cache size:\s*([\d,]+)\s*tokens", txt)
    cap = int(m[-1].replace(",", "")) if m else None
    mc = re.findall(r"Maximum concurrency for ([\d,]+) tokens per request:\s*([\d.]+)x", txt)
    return cap, (mc[-1] if mc else None)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default="rand7b")
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--raw", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--server-log", required=True)
    ap.add_argument(
        "--deadline", type=float, required=True, help="unix time after which no grid point starts"
    )
    ap.add_argument(
        "--hard-end", type=float, required=True, help="unix time by which every point must end"
    )
    ap.add_argument("--overload-cap-s", type=float, default=170.0)
    ap.add_argument(
        "--overload-demand", type=float, default=1.3, help="KV demand / logged capacity"
    )
    ap.add_argument("--overload-in", type=int, default=1024)
    ap.add_argument("--overload-out", type=int, default=3072)
    ap.add_argument("--seed-offset", type=int, default=0)
    ap.add_argument(
        "--points",
        default="grid,prefix,overload",
        help="comma list of: grid, prefix, overload, extra (extra = 1024/256 at concurrency 256), "
        "small (a small model's closed loops: overheads per step and per sequence, long prompts)",
    )
    a = ap.parse_args()
    os.makedirs(a.raw, exist_ok=True)

    import vllm
    from vllm.benchmarks.serve import add_cli_args, main_async
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cap, maxconc = kv_capacity(a.server_log)
    log("vllm", vllm.__version__, "KV capacity tokens:", cap, "max concurrency line:", maxconc)

    # (name, input, output, concurrency, num_prompts, prefix_len)
    want = set(a.points.split(","))
    pts = []
    if "grid" in want:
        for i, o, cs in (
            (128, 128, (1, 16, 128)),
            (1024, 256, (1, 4, 16, 64)),
            (4096, 512, (1, 8, 32)),
        ):
            for c in cs:
                pts.append((f"in{i}_out{o}_c{c}", i, o, c, max(8, 3 * c), 0))
    if "prefix" in want:
        pts.append(("prefix1024_in1024_out128_c16", 1024, 128, 16, 48, 1024))
    if "extra" in want:
        pts.append(("in1024_out256_c256", 1024, 256, 256, 512, 0))
    if "small" in want:
        for i, o, c, n in (
            (128, 128, 1, 8),
            (1024, 256, 16, 48),
            (1024, 256, 64, 128),
            (1024, 256, 256, 512),
            (4096, 512, 8, 24),
            (8192, 64, 4, 12),
        ):
            pts.append((f"in{i}_out{o}_c{c}", i, o, c, n, 0))
    # overload: enough concurrent KV demand to exceed the logged capacity -> preemptions.
    # Each request needs up to in+out tokens of KV; pick concurrency so demand = --overload-demand x capacity
    # (max_num_seqs default is 1024 on H200, max-model-len 8192).
    oi, oo = a.overload_in, a.overload_out
    if cap:
        oc = int(min(1024, math.ceil(a.overload_demand * cap / (oi + oo))))
    else:
        oc = 512
    if "overload" in want:
        pts.append((f"overload_in{oi}_out{oo}_c{oc}", oi, oo, oc, oc, 0))

    summary = {
        "vllm": vllm.__version__,
        "kv_capacity_tokens": cap,
        "max_concurrency_line": maxconc,
        "points": [],
        "started_unix": T0,
    }
    sp = os.path.join(a.out, "grid_summary.json")
    for idx, (name, i, o, c, n, pre) in enumerate(pts):
        is_over = name.startswith("overload")
        left = a.hard_end - time.time() - 15
        if (not is_over and time.time() > a.deadline) or (is_over and left < 60):
            summary["points"].append({"name": name, "skipped": f"deadline ({left:.0f}s left)"})
            log("SKIP (deadline)", name)
            continue
        argv = [
            "--backend",
            "openai",
            "--base-url",
            a.base,
            "--model",
            a.model,
            "--tokenizer",
            a.tokenizer,
            "--dataset-name",
            "random",
            "--random-input-len",
            str(i),
            "--random-output-len",
            str(o),
            "--random-range-ratio",
            "0",
            "--random-prefix-len",
            str(pre),
            "--num-prompts",
            str(n),
            "--max-concurrency",
            str(c),
            "--ignore-eos",
            "--seed",
            str(idx + 1 + a.seed_offset),
            "--disable-tqdm",
            "--percentile-metrics",
            "ttft,tpot,itl,e2el",
            "--metric-percentiles",
            "50,90,99",
            "--save-result",
            "--save-detailed",
            "--result-dir",
            a.raw,
            "--result-filename",
            f"point_{name}.json",
        ]
        p = FlexibleArgumentParser()
        add_cli_args(p)
        args = p.parse_args(argv)
        rec = {
            "name": name,
            "input_len": i,
            "output_len": o,
            "concurrency": c,
            "num_prompts": n,
            "prefix_len": pre,
            "seed": idx + 1 + a.seed_offset,
            "argv": argv,
        }
        timeout = min(a.overload_cap_s, left) if is_over else max(20.0, left)
        mb_txt = scrape(a.base)
        open(os.path.join(a.raw, f"metrics_{name}_before.txt"), "w").write(mb_txt)
        smp = Sampler(a.base)
        smp.start()
        t = time.time()
        try:
            res = asyncio.run(asyncio.wait_for(main_async(args), timeout))
            rec["ok"] = True
            rec["result"] = {
                k: v
                for k, v in res.items()
                if not isinstance(v, (list, dict)) or k in ("percentiles",)
            }
        except TimeoutError:
            rec["ok"] = False
            rec["error"] = (
                f"timeout after {timeout:.0f}s (cancelled; server aborts the in-flight requests)"
            )
        except Exception as ex:
            rec["ok"] = False
            rec["error"] = f"{type(ex).__name__}: {ex}"
            traceback.print_exc()
        rec["wall_s"] = time.time() - t
        smp.stop_ev.set()
        smp.join(timeout=3)
        time.sleep(1.0)  # let the server's counters settle
        ma_txt = scrape(a.base)
        open(os.path.join(a.raw, f"metrics_{name}_after.txt"), "w").write(ma_txt)
        rec["metrics_delta"] = deltas(parse_metrics(mb_txt), parse_metrics(ma_txt))
        rec["gauge_samples"] = smp.samples
        rec["max_running"] = max(
            (s.get("num_requests_running") or 0 for s in smp.samples), default=None
        )
        rec["max_waiting"] = max(
            (s.get("num_requests_waiting") or 0 for s in smp.samples), default=None
        )
        rec["max_kv_usage"] = max(
            (s.get("kv_cache_usage_perc") or 0 for s in smp.samples), default=None
        )
        # drop generated texts from the saved detailed file (garbage from dummy weights, large)
        fp = os.path.join(a.raw, f"point_{name}.json")
        if os.path.exists(fp):
            d = json.load(open(fp))
            d.pop("generated_texts", None)
            json.dump(d, open(fp, "w"))
        summary["points"].append(rec)
        json.dump(summary, open(sp, "w"), indent=1)
        r = rec.get("result", {})
        log(
            f"{name}: ok={rec['ok']} wall={rec['wall_s']:.1f}s ttft={r.get('mean_ttft_ms', 0):.1f}ms "
            f"tpot={r.get('mean_tpot_ms', 0):.2f}ms out_tok/s={r.get('output_throughput', 0):.0f} "
            f"preempt={rec['metrics_delta'].get('vllm:num_preemptions_total', 0)} "
            f"maxrun={rec['max_running']} maxkv={rec['max_kv_usage']}"
        )
    summary["elapsed_s"] = time.time() - T0
    json.dump(summary, open(sp, "w"), indent=1)
    log("grid done")


if __name__ == "__main__":
    main()
