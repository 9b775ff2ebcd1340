"""Fit the host-side overheads of the H200 efficiency (step overhead, per-sequence cost, the
API server's latency) to the real vLLM grid, on the fit points only.

Kernel efficiencies stay as measured by the micro-benchmarks (benchmarks/calibration/). The
objective is the relative error of mean TTFT, mean TPOT and output throughput on the points
that `servefleet.sim.validation.is_held_out` does not hold out.

Usage: python benchmarks/real_vllm/fit_overheads.py   (prints the fitted values)
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from servefleet.hardware import get_gpu
from servefleet.models import load_model
from servefleet.sim.deployment import resolve_deployment
from servefleet.sim.validation import is_held_out, load_points, simulate_point_like_bench

POINTS = Path(__file__).parent / "data" / "points.csv"
NAMES = ("step_overhead_s", "per_seq_overhead_s", "request_latency_s")
FIXED = {"frontend_request_s": 0.0}
"""Not fitted: vLLM's API server is one asyncio event loop that shares its CPU among all the
requests it is admitting and all the tokens it is streaming (docs/validation.md), not the FIFO
queue in front of the engine that ``Frontend`` models; fitted as a FIFO it trickles bursts into
the engine (which then keeps up) and makes the held-out TTFT worse, so it stays 0."""
TARGETS = ("mean_ttft_ms", "mean_tpot_ms", "output_throughput")


def deployment(params: np.ndarray):
    gpu = get_gpu("H200-SXM")
    eff = dataclasses.replace(gpu.efficiency, **FIXED, **dict(zip(NAMES, params, strict=True)))
    return resolve_deployment(
        load_model("Qwen2.5-7B"), gpu.with_efficiency(eff), tp=1, max_model_len=8192
    )


def residuals(params: np.ndarray, points) -> np.ndarray:
    dep = deployment(params)
    out = []
    for p in points:
        sim = simulate_point_like_bench(dep, p)
        out += [np.log(sim[m] / p.figures[m]) for m in TARGETS]
    return np.array(out)


def main() -> None:
    fit_points = [p for p in load_points(POINTS) if not is_held_out(p)]
    x0 = np.array([1.5e-3, 6e-6, 12e-3])
    res = least_squares(
        residuals,
        x0,
        args=(fit_points,),
        bounds=([0, 0, 0], [0.02, 2e-4, 0.05]),
        x_scale=x0,
        diff_step=0.05,
    )
    print(f"fit on {len(fit_points)} points: {[p.name for p in fit_points]}")
    for n, v in zip(NAMES, res.x, strict=True):
        print(f"  {n} = {v:.6g}")
    print(f"  rms log error {np.sqrt(np.mean(res.fun**2)):.3f}")


if __name__ == "__main__":
    main()
