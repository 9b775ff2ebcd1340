#!/usr/bin/env python3
"""The decode step's period at each point of the host-work grid, and the host work per stream
chunk it implies, by client protocol; the per-chunk cost fitted on the fit points predicts the
held-out points' period.

    python3 host_steps.py host_points.csv iterations.csv.gz

A decode step here is an engine iteration with no prompt tokens whose successor has none
either; its period is the wall time to the next iteration as vLLM logs them. Where the period
is longer than the GPU's work, a step costs ``chunk_us`` per stream chunk the API server sends
for it: ``period = chunk_us x sequences / tokens per chunk``. ``chunk_us`` per protocol is the
least-squares fit (through 0) over the fit points at or above ``HOST_BOUND`` sequences; the
held-out points (``host_points.HELD_OUT``) are predicted from it.
"""

import argparse
import csv
import gzip
import itertools
from collections import defaultdict

import numpy as np

HOST_BOUND = 100
"""Sequences per step from which the step is host-bound (an 8B decode step on one H100 takes
about 7 ms of GPU work up to ~100 sequences: the period is flat below)."""


def decode_steps(path: str) -> dict[str, np.ndarray]:
    """Per series: (t, sequences, period ms) of each decode step followed by a decode step."""
    with gzip.open(path, "rt") as f:
        rows = list(csv.DictReader(f))
    out: dict[str, list] = defaultdict(list)
    for a, b in itertools.pairwise(rows):
        if a["series"] and a["series"] == b["series"] and a["ctx_reqs"] == b["ctx_reqs"] == "0":
            out[a["series"]].append(
                (float(a["t"]), int(a["gen_reqs"]), (float(b["t"]) - float(a["t"])) * 1e3)
            )
    return {k: np.array(v) for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("points")
    ap.add_argument("iterations")
    a = ap.parse_args()
    steps = decode_steps(a.iterations)
    with open(a.points) as f:
        pts = list(csv.DictReader(f))
    table = []
    for p in pts:
        s = steps.get(p["series"])
        c = int(float(p["concurrency"]))
        if s is None:
            continue
        near = s[(s[:, 1] >= 0.9 * c) & (s[:, 1] <= c)]  # the steps of this point's full batch
        if len(near) < 10:
            continue
        tpc = float(p["tokens_per_chunk"])
        n = float(near[:, 1].mean())
        table.append({
            "series": p["series"], "c": c, "held_out": p["held_out"] == "True", "steps": len(near),
            "seqs": n, "tpc": tpc, "mean": float(near[:, 2].mean()),
            "p50": float(np.median(near[:, 2])), "p95": float(np.percentile(near[:, 2], 95)),
            "chunk_us": 1e3 * float(near[:, 2].mean()) * tpc / n,
        })  # fmt: skip
    print(
        "| series | c | held out | decode steps | sequences | tokens per chunk | period mean / P50 / P95 ms | host per chunk |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for r in table:
        print(f"| {r['series']} | {r['c']} | {'yes' if r['held_out'] else 'no'} | {r['steps']} | "
              f"{r['seqs']:.1f} | {r['tpc']:.2f} | {r['mean']:.1f} / {r['p50']:.1f} / {r['p95']:.1f} | "
              f"{r['chunk_us']:.0f} us |")  # fmt: skip
    print(
        f"\nper-chunk cost fitted on the fit points at >= {HOST_BOUND} sequences; held-out period:"
    )
    for series in sorted({r["series"] for r in table}):
        fit = [
            r
            for r in table
            if r["series"] == series and not r["held_out"] and r["seqs"] >= HOST_BOUND
        ]
        x = np.array([r["seqs"] / r["tpc"] for r in fit])
        y = np.array([r["mean"] for r in fit])
        if not len(x):
            continue
        us = 1e3 * float(x @ y / (x @ x))
        held = [r for r in table if r["series"] == series and r["held_out"]]
        cells = [f"c={r['c']}: {us * r['seqs'] / r['tpc'] / 1e3:.1f} vs {r['mean']:.1f} ms "
                 f"({us * r['seqs'] / r['tpc'] / 1e3 / r['mean'] - 1:+.0%})" for r in held]  # fmt: skip
        print(f"  {series}: {us:.0f} us a chunk ({len(fit)} points); " + "; ".join(cells))


if __name__ == "__main__":
    main()
