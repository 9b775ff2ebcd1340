"""Where real vLLM's TTFT goes, per point: API server vs engine queue vs engine prefill.

From the `/metrics` deltas kept per point (grid_summary.json): vLLM's own histograms give the
engine core's queue time (``request_queue_time``: queued -> first scheduled) and prefill time
(``request_prefill_time``: first scheduled -> first token, engine clock). The rest of the client's
TTFT is the API server's (HTTP, rendering and tokenization, IPC, then streaming the first token
back). With ``--waves`` it also prints, from the per-request data in grid_raw.tar.xz, when each
closed-loop wave's first tokens reached the client (clumps of first tokens within 15 ms). With
``--costs`` it derives the API-server model's CPU costs (``servefleet.sim.frontend``) from the
split: see ``costs``.

Usage: python benchmarks/real_vllm/ttft_breakdown.py [--waves POINT | --costs]
"""

from __future__ import annotations

import argparse
import json
import re
import tarfile
from pathlib import Path

import numpy as np

DATA = Path(__file__).parent / "data"


def mean_ms(m: dict, name: str) -> float:
    return 1000 * m[f"vllm:{name}_sum"] / m[f"vllm:{name}_count"]


def _points():
    for run in sorted(DATA.glob("*/grid_summary.json")):
        for p in json.loads(run.read_text())["points"]:
            if p["ok"]:
                yield run.parent, p


def _api_ms(p: dict) -> float:
    m = p["metrics_delta"]
    queue = mean_ms(m, "request_queue_time_seconds")
    prefill = mean_ms(m, "request_prefill_time_seconds")
    return p["result"]["mean_ttft_ms"] - queue - prefill


def costs() -> None:
    """The API server's CPU costs, from the split (no client TTFT is fitted).

    Admission: a closed loop at fixed lengths sends ``c`` requests together; one CPU shared by
    them admits them all ``c * s`` after they arrive, so the API server's share grows by
    ``(c - 1) * s`` over the single-stream one at the same prompt length ``P``. A relative
    least-squares fit of ``s = request_s + prompt_token_s * P`` over the fixed-length sweeps
    at c > 1 gives the two admission costs.

    Streaming: at 128/128 c=128 the server sent fewer chunks than tokens (it was saturated and
    merged tokens): ``chunks per token * c`` chunks per engine step (the engine's ITL), so one
    chunk costs ``ITL / (chunks per token * c)``.
    """
    single, rows = {}, []
    for _, p in _points():
        m = re.fullmatch(r"in(\d+)_out(\d+)_c(\d+)", p["name"])
        if m is None:
            continue
        plen, c = int(m[1]), int(m[3])
        if c == 1:
            single[plen] = _api_ms(p)
        else:
            rows.append((plen, c, _api_ms(p)))
    x = np.array([[c - 1, (c - 1) * plen] for plen, c, _ in rows], float)
    y = np.array([api - single[plen] for plen, _, api in rows])
    request_ms, token_ms = np.linalg.lstsq(x / y[:, None], np.ones(len(y)), rcond=None)[0]
    print(f"admission: {request_ms:.3f} ms + {1000 * token_ms:.3f} us per prompt token")
    for (plen, c, _), extra in zip(rows, y, strict=True):
        model = (c - 1) * (request_ms + token_ms * plen)
        print(
            f"  {plen}-token prompts, c={c}: extra API share {extra:.0f} ms, model {model:.0f} ms"
        )
    run_dir, p = next((d, p) for d, p in _points() if p["name"] == "in128_out128_c128")
    itl = mean_ms(p["metrics_delta"], "inter_token_latency_seconds")
    ratio = _chunk_ratio(run_dir, p["name"])
    print(
        f"streaming: {1000 * itl / (ratio * 128):.0f} us per chunk "
        f"(engine ITL {itl:.2f} ms, {ratio:.2f} chunks per token at c=128)"
    )


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
    ap.add_argument("--costs", action="store_true", help="derive the API server's CPU costs")
    args = ap.parse_args()
    if args.costs:
        costs()
    elif args.waves:
        waves(args.waves)
    else:
        breakdown()


if __name__ == "__main__":
    main()
