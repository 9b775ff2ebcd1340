#!/usr/bin/env python3
"""Sample a vLLM server's /metrics every PERIOD seconds until killed (on the GPU machine).

    python3 gauge_sampler.py URL OUT.jsonl [PERIOD]

One JSON line per sample: ``t`` (unix seconds) and the value of every unlabelled-or-summed
``vllm:`` counter and gauge below (labels summed). The scheduler's state over time: running,
waiting, KV use, preemptions, tokens, prefix-cache queries and hits.
"""

import contextlib
import json
import sys
import time
import urllib.request

NAMES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:request_success_total",
)


def sample(url):
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    out = dict.fromkeys(NAMES, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in out:
            with contextlib.suppress(ValueError):
                out[name] += float(line.rsplit(" ", 1)[1])
    return out


def main():
    url, path = sys.argv[1], sys.argv[2]
    period = float(sys.argv[3]) if len(sys.argv) > 3 else 0.5
    with open(path, "a") as f:
        while True:
            t = time.time()
            try:
                row = {"t": round(t, 3)} | {
                    k.removeprefix("vllm:"): v for k, v in sample(url).items()
                }
                f.write(json.dumps(row) + "\n")
                f.flush()
            except Exception as exc:  # the server may be busy or gone; keep sampling
                f.write(json.dumps({"t": round(t, 3), "error": str(exc)[:200]}) + "\n")
            time.sleep(max(0.0, period - (time.time() - t)))


if __name__ == "__main__":
    main()
