#!/usr/bin/env python3
"""Fit vLLM 0.26's host work from the host-work grid (``host_points.csv``), on the fit points
only (``held_out`` false), and report the errors on the held-out points.

    python3 fit_host_work.py benchmarks/real_vllm/data/host-grid/host_points.csv [--write F.json]

Two parts, one per process:

* **Engine core, per step** (its CPU time not hidden behind the GPU): ``it_host_ms`` (mean
  wall time between iterations minus vLLM's "iteration elapsed time", the time the engine core
  waited on the GPU) = ``step_ms + seq_us × sequences + prefill_us × prefill tokens`` of the
  step, least squares over every fit point of every series (the client protocol does not reach
  the engine core: a separate process).
* **API server, per streamed token and per chunk**, by client protocol (endpoint × per-chunk
  usage): the API server is one CPU. Where it is saturated (more than ``SATURATED`` tokens per
  chunk: its chunks carry several engine steps' tokens), its work adds up to one CPU-second a
  second: ``tok/s × token_us + chunks/s × chunk_us[protocol] + req/s × request_us + prompt
  tok/s × prompt_token_us = 1``, with ``request_us`` and ``prompt_token_us`` as the simulator
  has them (``hardware.py``: 1.34 ms, 1.17 µs). ``token_us`` (output processing and
  detokenization, per token whatever the chunking) is shared; ``chunk_us`` (SSE framing, JSON,
  usage accounting) is per protocol. Least squares over the saturated fit points (negative
  costs clipped to 0).
  Held out: the tokens per chunk this predicts at the measured throughput
  (``tok/s ÷ chunks/s``, where ``chunks/s`` is what the CPU left after tokens and admissions
  can send), against the measured.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
from pathlib import Path

import numpy as np

SATURATED = 1.05
REQUEST_S = 1.34e-3
PROMPT_TOKEN_S = 1.17e-6


def rows(path: str) -> list[dict]:
    with open(path) as f:
        out = []
        for r in csv.DictReader(f):
            for k, v in r.items():
                if v in ("True", "False"):
                    r[k] = v == "True"
                else:
                    with contextlib.suppress(TypeError, ValueError):
                        r[k] = float(v)
            out.append(r)
    return out


def protocol(r: dict) -> str:
    return f"{r['endpoint']}-{'usage' if r['usage_per_chunk'] else 'sdk'}"


def engine_fit(pts: list[dict]) -> dict:
    fit = [r for r in pts if not r["held_out"] and isinstance(r.get("it_host_ms"), float)]
    x = np.array([[1.0, r["it_seqs"], r["it_ctx_tokens"]] for r in fit])
    y = np.array([r["it_host_ms"] for r in fit])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)

    def pred(r):
        return coef[0] + coef[1] * r["it_seqs"] + coef[2] * r["it_ctx_tokens"]

    def errs(sel):
        return [
            {"series": r["series"], "c": int(r["concurrency"]), "measured_ms": r["it_host_ms"],
             "predicted_ms": pred(r), "err": pred(r) / r["it_host_ms"] - 1}
            for r in sel
        ]  # fmt: skip

    held = [r for r in pts if r["held_out"] and isinstance(r.get("it_host_ms"), float)]
    return {
        "step_ms": coef[0], "seq_us": 1e3 * coef[1], "prefill_token_us": 1e3 * coef[2],
        "fit_points": len(fit), "fit": errs(fit), "held_out": errs(held),
    }  # fmt: skip


def api_fit(pts: list[dict]) -> dict:
    protos = sorted({protocol(r) for r in pts})
    sat = [
        r for r in pts
        if not r["held_out"] and (r.get("tokens_per_chunk") or 0) > SATURATED
    ]  # fmt: skip
    a, b = [], []
    for r in sat:
        tok = r["out_tok_per_s"]
        chunks = tok / r["tokens_per_chunk"]
        rest = (
            1.0 - r["req_per_s"] * REQUEST_S - r["req_per_s"] * r["prompt_tokens"] * PROMPT_TOKEN_S
        )
        a.append([tok] + [chunks if protocol(r) == p else 0.0 for p in protos])
        b.append(rest)
    out: dict = {"saturated_fit_points": len(sat), "protocols": protos}
    if len(sat) < 2:
        return out
    coef = np.clip(np.linalg.lstsq(np.array(a), np.array(b), rcond=None)[0], 0.0, None)
    token_s, chunk_s = coef[0], dict(zip(protos, coef[1:], strict=True))
    out["token_us"] = 1e6 * token_s
    out["chunk_us"] = {p: 1e6 * v for p, v in chunk_s.items()}

    def tpc(r):
        tok = r["out_tok_per_s"]
        rest = 1.0 - r["req_per_s"] * (REQUEST_S + r["prompt_tokens"] * PROMPT_TOKEN_S)
        room = rest - tok * token_s
        cs = chunk_s[protocol(r)]
        if cs <= 0 or room <= 0:
            return None
        return max(1.0, tok / (room / cs))

    def errs(sel):
        return [
            {"series": r["series"], "c": int(r["concurrency"]),
             "tokens_per_chunk": r["tokens_per_chunk"], "predicted": tpc(r),
             "err": (tpc(r) / r["tokens_per_chunk"] - 1) if tpc(r) else None}
            for r in sel
        ]  # fmt: skip

    out["fit"] = errs([r for r in pts if not r["held_out"]])
    out["held_out"] = errs([r for r in pts if r["held_out"]])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("points")
    ap.add_argument("--write")
    a = ap.parse_args()
    pts = rows(a.points)
    res = {"engine": engine_fit(pts), "api_server": api_fit(pts)}
    e = res["engine"]
    print(
        f"engine core host per step: {e['step_ms']:.3f} ms + {e['seq_us']:.2f} us/seq + "
        f"{e['prefill_token_us']:.3f} us/prefill token ({e['fit_points']} fit points)"
    )
    for h in e["held_out"]:
        print(f"  held out {h['series']} c={h['c']}: {h['measured_ms']:.2f} ms measured, "
              f"{h['predicted_ms']:.2f} predicted ({h['err']:+.1%})")  # fmt: skip
    s = res["api_server"]
    if "token_us" in s:
        print(f"API server: {s['token_us']:.1f} us/token + per chunk " + ", ".join(
            f"{p} {v:.1f} us" for p, v in s["chunk_us"].items()))  # fmt: skip
        for h in s["held_out"]:
            print(f"  held out {h['series']} c={h['c']}: tokens/chunk {h['tokens_per_chunk']:.2f} "
                  f"measured, {h['predicted'] or float('nan'):.2f} predicted")  # fmt: skip
    if a.write:
        Path(a.write).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
