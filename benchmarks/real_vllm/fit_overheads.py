"""Fit the host-side overheads of the H200 efficiency to the real vLLM grid, on the fit points
only: the API server's fixed latency (``request_latency_s``), and with ``--engine`` also the
engine's host work per step (graph-replayed decodes ``host_step_s``, piecewise steps
``step_overhead_s``) and per sequence (``per_seq_overhead_s``).

Kernel efficiencies stay as measured by the micro-benchmarks (benchmarks/calibration/). The
API server's CPU costs (``FIXED``) are derived from vLLM's own /metrics split of TTFT
(``ttft_breakdown.py --costs``), not fitted. The objective is the relative error of mean TTFT,
mean TPOT and output throughput on the points that `servefleet.sim.validation.is_held_out` does
not hold out.

Usage: python benchmarks/real_vllm/fit_overheads.py [--engine]   (prints the fitted values)
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares
from validate import deployment as run_deployment

from servefleet.sim.validation import is_held_out, load_points, simulate_point_like_bench

POINTS = Path(__file__).parent / "data" / "points.csv"
START = {
    "host_step_s": 2e-3,
    "step_overhead_s": 4e-3,
    "per_seq_overhead_s": 20e-6,
    "request_latency_s": 9e-3,
}
UPPER = {
    "host_step_s": 0.01,
    "step_overhead_s": 0.02,
    "per_seq_overhead_s": 2e-4,
    "request_latency_s": 0.05,
}
FIXED = {
    "frontend_request_s": 1.34e-3,
    "frontend_prompt_token_s": 1.17e-6,
    "frontend_chunk_s": 64e-6,
}
"""The API server's CPU costs (``servefleet.sim.frontend``), derived from the /metrics split
(docs/validation.md, "The API-server model"). The fit points alone cannot separate them from
``request_latency_s`` and ``step_overhead_s``: all three add to TTFT when requests arrive."""
TARGETS = ("mean_ttft_ms", "mean_tpot_ms", "output_throughput")


def deployment(run: str, names: tuple[str, ...], params: np.ndarray):
    dep = run_deployment(run)
    values = dict(zip(names, params, strict=True))
    eff = dataclasses.replace(dep.gpu.efficiency, **FIXED, **values)
    return dep.with_(gpu=dep.gpu.with_efficiency(eff))


def residuals(params: np.ndarray, names: tuple[str, ...], points) -> np.ndarray:
    out = []
    for p in points:
        sim = simulate_point_like_bench(deployment(p.run, names, params), p)
        out += [np.log(sim[m] / p.figures[m]) for m in TARGETS]
    return np.array(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument(
        "--engine", action="store_true", help="also refit the engine's host work (step, sequence)"
    )
    args = ap.parse_args()
    names = tuple(START) if args.engine else ("request_latency_s",)
    fit_points = [p for p in load_points(POINTS) if not is_held_out(p)]
    x0 = np.array([START[n] for n in names])
    res = least_squares(
        residuals,
        x0,
        args=(names, fit_points),
        bounds=([0] * len(names), [UPPER[n] for n in names]),
        x_scale=x0,
        diff_step=0.05,
    )
    print(f"fit on {len(fit_points)} points: {[p.name for p in fit_points]}")
    for n, v in zip(names, res.x, strict=True):
        print(f"  {n} = {v:.6g}")
    print(f"  rms log error {np.sqrt(np.mean(res.fun**2)):.3f}")


if __name__ == "__main__":
    main()
