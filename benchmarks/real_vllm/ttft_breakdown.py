"""Where real vLLM's TTFT goes, per point: API server vs engine queue vs engine prefill.

From the `/metrics` deltas kept per point (grid_summary.json): vLLM's own histograms give the
engine core's queue time (``request_queue_time``: queued -> first scheduled) and prefill time
(``request_prefill_time``: first scheduled -> first token, engine clock). The rest of the client's
TTFT is the API server's (HTTP, rendering and tokenization, IPC, then streaming the first token
back). With ``--waves`` it also prints, from the per-request data in grid_raw.tar.xz, when each
closed-loop wave's first tokens reached the client (clumps of first tokens within 15 ms).

Usage: python benchmarks/real_vllm/ttft_breakdown.py [--waves POINT]
"""

from __future__ import annotations

import argparse
import json
import tarfile
from pathlib import Path

DATA = Path(__file__).parent / "data"


def mean_ms(m: dict, name: str) -> float:
    return 1000 * m[f"vllm:{name}_sum"] / m[f"vllm:{name}_count"]


def breakdown() -> None:
    print(
        "| point | client TTFT | API server | engine queue | engine prefill | "
        "engine ITL | client TPOT | chunks / tokens |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for run in sorted(DATA.glob("*/grid_summary.json")):
        for p in json.loads(run.read_text())["points"]:
            if not p["ok"]:
                continue
            m, r = p["metrics_delta"], p["result"]
            queue = mean_ms(m, "request_queue_time_seconds")
            prefill = mean_ms(m, "request_prefill_time_seconds")
            itl = mean_ms(m, "inter_token_latency_seconds")
            chunks = _chunk_ratio(run.parent, p["name"])
            api = r["mean_ttft_ms"] - queue - prefill
            print(
                f"| {p['name']} | {r['mean_ttft_ms']:,.0f} | {api:,.0f} | {queue:,.0f} | "
                f"{prefill:,.0f} | {itl:.2f} | {r['mean_tpot_ms']:.2f} | {chunks:.2f} |"
            )


def _detail(run_dir: Path, name: str) -> dict:
    with tarfile.open(run_dir / "grid_raw.tar.xz") as tar:
        f = tar.extractfile(f"raw/point_{name}.json")
        assert f is not None
        return json.load(f)


def _chunk_ratio(run_dir: Path, name: str) -> float:
    """Stream chunks per generated token after the first (1.0: one token per chunk; less: the
    API server fell behind and sent several tokens in one chunk)."""
    d = _detail(run_dir, name)
    gaps = sum(len(x) for x in d["itls"])
    return gaps / sum(n - 1 for n in d["output_lens"])


def waves(name: str) -> None:
    run_dir = next(
        r.parent
        for r in DATA.glob("*/grid_summary.json")
        if any(p["name"] == name for p in json.loads(r.read_text())["points"])
    )
    d = _detail(run_dir, name)
    c = d["max_concurrency"]
    starts, ttfts = d["start_times"], d["ttfts"]
    order = sorted(range(len(starts)), key=starts.__getitem__)
    for w in range(0, len(order), c):
        idx = order[w : w + c]
        s0 = starts[idx[0]]
        firsts = sorted(round(1000 * (starts[i] + ttfts[i] - s0)) for i in idx)
        clumps: list[list[int]] = []
        for t in firsts:
            if clumps and t - clumps[-1][0] <= 15:
                clumps[-1] = [t, clumps[-1][1] + 1]
            else:
                clumps.append([t, 1])
        print(
            f"wave at {s0 - starts[order[0]]:.2f} s: first tokens (ms after the wave, count): {clumps}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--waves", metavar="POINT", help="print one point's waves of first tokens")
    args = ap.parse_args()
    if args.waves:
        waves(args.waves)
    else:
        breakdown()


if __name__ == "__main__":
    main()
