#!/usr/bin/env python3
"""Time to first token of a lone prompt of exactly N tokens (device side, nothing else running).

    python3 lone_prefill.py --base URL --model NAME --tokens 1000 --reps 12 --label bf16 --out F.json

Each repetition sends /v1/completions with ``prompt`` as N fresh random token ids (no prefix-cache
hit), ``max_tokens`` 1, streamed, and times the first data chunk from the request's last byte on
the wire; the first two repetitions warm up and are left out of the median.
"""

import argparse
import http.client
import json
import random
import statistics
import time
from pathlib import Path
from urllib.parse import urlparse


def one(base: str, model: str, ids: list[int]) -> tuple[float, float]:
    u = urlparse(base)
    body = json.dumps(
        {
            "model": model,
            "prompt": ids,
            "max_tokens": 1,
            "stream": True,
            "ignore_eos": True,
            "temperature": 0.0,
        }
    ).encode()
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    c.connect()
    c.putrequest("POST", "/v1/completions")
    c.putheader("Content-Type", "application/json")
    c.putheader("Content-Length", str(len(body)))
    c.endheaders()
    c.send(body)
    t0 = time.perf_counter()
    r = c.getresponse()
    first = None
    while True:
        line = r.readline()
        if not line:
            break
        if line.startswith(b"data:") and first is None:
            first = time.perf_counter() - t0
        if line.strip() == b"data: [DONE]":
            break
    e2e = time.perf_counter() - t0
    c.close()
    return first if first is not None else float("nan"), e2e


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--label", default="")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    rng = random.Random(1000 + a.tokens)
    rows = []
    for i in range(a.reps):
        ids = [rng.randrange(1000, 100000) for _ in range(a.tokens)]
        ttft, e2e = one(a.base, a.model, ids)
        rows.append({"rep": i, "ttft_s": ttft, "e2e_s": e2e, "t": time.time()})
        time.sleep(0.2)
    kept = [r["ttft_s"] for r in rows[2:]]
    res = {
        "label": a.label,
        "prompt_tokens": a.tokens,
        "reps": rows,
        "ttft_median_ms": 1000 * statistics.median(kept),
        "ttft_min_ms": 1000 * min(kept),
    }
    Path(a.out).write_text(json.dumps(res, indent=1))
    print(
        f"lone prefill {a.label}: {a.tokens} tokens TTFT median {res['ttft_median_ms']:.2f} ms "
        f"min {res['ttft_min_ms']:.2f} ms over {len(kept)} reps"
    )


if __name__ == "__main__":
    main()
