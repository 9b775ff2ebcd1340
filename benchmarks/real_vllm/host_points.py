#!/usr/bin/env python3
"""One row per point of the host-work grid (``run_host_grid.sh``): the client's figures, the
chunking, and the engine's iterations during the point (from ``host_iterations.py``).

    python3 host_points.py GRID_DIR --iterations iterations.csv.gz --out host_points.csv

GRID_DIR holds ``bench/<series>/summary.json`` + records and the stamped ``bench-<series>.log``
of each series (the unpacked ``bench-*.tar.xz``). A series is ``<mix>-<endpoint>-usage<on|off>``.
``held_out`` marks the points no fit may use (``HELD_OUT``: every series' c=256).

Iteration columns, over the iterations logged between the point's start and end (its steady
middle: the requests sent after the warm-up and before the cool-down): ``it_n``, mean
``it_period_ms`` (wall time between iterations), mean ``it_elapsed_ms`` (vLLM's "iteration
elapsed time": with async scheduling, the time the engine core waited on the step's output
future, which is not the GPU's time), their difference ``it_host_ms``, mean
``it_seqs``, ``it_tokens``, ``it_ctx_tokens``, and period P50/P95.
"""

import argparse
import csv
import gzip
import json
import re
from pathlib import Path

import numpy as np

HELD_OUT = {256}
START = re.compile(r"^(\d+\.\d+) point \d+(?:/\d+)?: c=(\d+) started")
DONE = re.compile(r"^(\d+\.\d+) point \d+: c=(\d+) done")


def point_windows(log: Path) -> dict[int, tuple[float, float]]:
    starts, out = {}, {}
    for line in log.read_text().splitlines():
        if m := START.match(line):
            starts[int(m.group(2))] = float(m.group(1))
        elif (m := DONE.match(line)) and int(m.group(2)) in starts:
            c = int(m.group(2))
            out[c] = (starts[c], float(m.group(1)))
    return out


def ms(seconds: float | None) -> float | None:
    """Milliseconds; None where the point's window held no finished request."""
    return None if seconds is None else 1e3 * seconds


def load_iterations(path: str) -> np.ndarray:
    with gzip.open(path, "rt") as f:
        rows = list(csv.DictReader(f))
    cols = ("t", "ctx_reqs", "ctx_tokens", "gen_reqs", "gen_tokens", "elapsed_ms")
    return np.array([[float(r[c]) for c in cols] for r in rows]) if rows else np.zeros((0, 6))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("grid", nargs="+")
    ap.add_argument("--iterations", nargs="*", default=[])
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    its = [load_iterations(p) for p in a.iterations]
    it = np.concatenate(its) if its else np.zeros((0, 6))
    it = it[np.argsort(it[:, 0])] if len(it) else it
    rows = []
    for grid in map(Path, a.grid):
        for sdir in sorted((grid / "bench").iterdir()):
            mix, endpoint, usage = sdir.name.rsplit("-", 2)
            summ = json.loads((sdir / "summary.json").read_text())
            wins = point_windows(grid / f"bench-{sdir.name}.log")
            for p in summ["points"]:
                c = p["load"]["concurrency"]
                s = p["summary"]
                with gzip.open(sdir / p["records_file"], "rt") as f:
                    recs = [json.loads(x) for x in f]
                w0, w1 = p["window"]["start"], p["window"]["end"]
                ok = [r for r in recs if r["status"] == "ok" and r["first_token_time"] is not None]
                win = [r for r in ok if w0 <= r["send_time"] < w1] or ok
                chunks = sum(len(r["chunk_times"]) for r in win)
                toks = sum(sum(r["chunk_tokens"]) for r in win)
                row = {
                    "run": grid.name, "series": sdir.name, "mix": mix, "endpoint": endpoint,
                    "usage_per_chunk": usage == "usageon", "concurrency": c,
                    "held_out": c in HELD_OUT, "requests": s["window_ok"],
                    "prompt_tokens": s["prompt_tokens"]["mean"] if isinstance(s["prompt_tokens"], dict) else s["prompt_tokens"],
                    "output_tokens": s["output_tokens"]["mean"] if isinstance(s["output_tokens"], dict) else s["output_tokens"],
                    "req_per_s": s["request_throughput"], "out_tok_per_s": s["output_throughput"],
                    "ttft_p50_ms": ms(s["ttft"]["p50"]), "ttft_p95_ms": ms(s["ttft"]["p95"]),
                    "itl_p50_ms": ms(s["itl"]["p50"]), "itl_p95_ms": ms(s["itl"]["p95"]),
                    "tpot_mean_ms": ms(s["tpot"]["mean"]), "e2e_p50_ms": ms(s["e2e_latency"]["p50"]),
                    "tokens_per_chunk": toks / chunks if chunks else None,
                    "client_cpu": p["selfcheck"].get("client_cpu"),
                    "client_bound": p["selfcheck"].get("client_bound"),
                }  # fmt: skip
                if c in wins and len(it):
                    t0, t1 = wins[c]
                    # the steady middle: from warm-up end to cool-down start, in wall time
                    dur = summ["settings"]["duration"] or (t1 - t0)
                    a0, a1 = t0 + w0, t0 + min(w1, dur)
                    m = it[(it[:, 0] >= a0) & (it[:, 0] <= a1)]
                    if len(m) > 2:
                        per = np.diff(m[:, 0]) * 1e3
                        row.update({
                            "it_n": len(m),
                            "it_period_ms": (m[-1, 0] - m[0, 0]) * 1e3 / (len(m) - 1),
                            "it_period_p50_ms": float(np.percentile(per, 50)),
                            "it_period_p95_ms": float(np.percentile(per, 95)),
                            "it_elapsed_ms": float(m[1:, 5].mean()),
                            "it_seqs": float((m[:, 1] + m[:, 3]).mean()),
                            "it_tokens": float((m[:, 2] + m[:, 4]).mean()),
                            "it_ctx_tokens": float(m[:, 2].mean()),
                        })  # fmt: skip
                        row["it_host_ms"] = row["it_period_ms"] - row["it_elapsed_ms"]
                rows.append(row)
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(a.out, "w", newline="") as f:
        w = csv.DictWriter(f, keys)
        w.writeheader()
        w.writerows(rows)
    print(f"{len(rows)} points -> {a.out}")


if __name__ == "__main__":
    main()
