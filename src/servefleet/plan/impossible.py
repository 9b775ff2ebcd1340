"""The messages of a plan that cannot be made: why, with the numbers, and what would change it."""

from __future__ import annotations

from servefleet.engine.memory import GiB

from . import plausibility as pl
from .memory_table import MemoryRow
from .precision import quantization_options
from .search import CandidateResult


def fits_nowhere(req, model, gpu, dtype, rows: list[MemoryRow]) -> str:
    lines = [
        f"{model.name} does not fit on {req.num_gpus} x {gpu.name} in {dtype} at any tensor-"
        f"parallel size that splits a host ({', '.join(str(r.tp) for r in rows)}):"
    ]
    for r in rows:
        lines.append(f"  TP={r.tp}: {r.problem}")
    big = max(rows, key=lambda r: r.tp)
    budget = int(gpu.memory_bytes * (req.overrides.gpu_memory_utilization or 0.9))
    for q in quantization_options(model, gpu, big.tp, dtype)[1:]:
        fits = q.weights_per_gpu < budget
        if fits and q.supported:
            lines.append(
                f"  with {q.name} the weights would take {q.weights_per_gpu / GiB:.1f} GiB per "
                f"GPU at TP={big.tp} ({q.how})"
            )
    lines.append(
        "Use more GPUs per host (--num-gpus), a GPU with more memory, a shorter "
        "--max-model-len, or a quantized checkpoint."
    )
    return "\n".join(lines)


def below_bound(req, gpu, bad: list[pl.Finding]) -> str:
    lines = [f"the SLO cannot be met on {req.total_gpus} x {gpu.name} by any configuration:"]
    for f in bad:
        lines.append(f"  {f.text}")
        if f.check == "itl-slo":
            lines.append(
                f"  → --slo-itl must be at least {f.bound * 1e3:.1f} ms (more is needed in practice)"
            )
        elif f.check == "ttft-slo":
            lines.append(
                f"  → --slo-ttft must be at least {f.bound:.2f} s (more is needed in practice)"
            )
        elif f.check == "burst":
            lines.append(
                f"  → --slo-ttft must be at least {f.bound:.1f} s, or apply the SLO to the other "
                "classes only (--slo-classes), or spread the bursts"
            )
    return "\n".join(lines)


def no_rate(req, results: list[CandidateResult], lowest_rate: float) -> str:
    """No split met the SLO at any rate its search tried (the bounds allowed it)."""
    lines = [
        f"no configuration meets {req.slo.describe()}: the physical bounds allow it, the "
        "simulated engine does not. At the lowest rate each split tried:"
    ]
    best_ttft = best_itl = None
    for r in results:
        low = r.lowest
        if low is None:
            continue
        if r.futile:
            why = "halving the rate no longer cut the share of requests that miss"
        elif low.rate < lowest_rate * 1.5:
            why = f"lower rates would need windows over {req.settings.max_window:g} s"
        else:
            why = "lowest rate tried"
        lines.append(f"  {r.candidate.name}: at {low.rate:g} req/s {low.why} ({why})")
        if low.ttft is not None:
            best_ttft = low.ttft if best_ttft is None else min(best_ttft, low.ttft)
        if low.itl is not None:
            best_itl = low.itl if best_itl is None else min(best_itl, low.itl)
    hints = []
    if best_ttft is not None and req.slo.ttft is not None and best_ttft > req.slo.ttft:
        hints.append(f"--slo-ttft {best_ttft * 1.1:.2g}")
    if best_itl is not None and req.slo.itl is not None and best_itl > req.slo.itl:
        hints.append(f"--slo-itl {best_itl * 1.1:.2g}")
    if hints:
        lines.append(
            "The best of them would meet " + " ".join(hints) + "; or apply the SLO to some "
            "classes only (--slo-classes)."
        )
    return "\n".join(lines)
