"""Physical plausibility: what no configuration of these GPUs can beat, with the arithmetic.

Every bound uses datasheet numbers (peak tensor FLOP/s, HBM bandwidth), not the achievable
fractions the simulator uses, so a number below a bound is impossible, not merely unlikely:

* decode: a step reads every weight of a GPU's shard once, ``weights / TP / bandwidth``; no
  inter-token latency is shorter;
* prefill: a prompt's FLOPs on TP GPUs at peak; no request's TTFT is shorter, so the workload's
  TTFT percentile is at least that percentile of the per-request bounds;
* bursts: n prompts arriving at once; even with every GPU of the fleet at peak, the k-th first
  token comes no earlier than the FLOPs of the k cheapest prompts ÷ the fleet's FLOP/s;
* throughput: every token costs ``2 × parameters`` FLOPs; the fleet at peak bounds requests/s.

``check_slo`` (requested SLOs), ``check_target`` (a requested rate), ``check_claims`` (numbers
someone claims) and ``check_prediction`` (the planner's own prediction) all return findings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from servefleet.engine.memory import GiB, weight_bytes_per_gpu
from servefleet.hardware import GPUSpec
from servefleet.models import ModelSpec
from servefleet.plan.profile import WorkloadProfile

CLAIM_KEYS = {
    "itl": "inter-token latency, seconds",
    "ttft": "median TTFT on this workload, seconds",
    "throughput": "output tokens/s of the whole inventory",
    "rate": "requests/s of the whole inventory",
}


@dataclass(frozen=True, slots=True)
class Finding:
    check: str
    ok: bool
    value: float | None
    bound: float
    text: str

    def __post_init__(self) -> None:  # numpy scalars in, plain Python out (JSON)
        object.__setattr__(self, "ok", bool(self.ok))
        object.__setattr__(self, "bound", float(self.bound))
        if self.value is not None:
            object.__setattr__(self, "value", float(self.value))

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}


@dataclass(frozen=True, slots=True)
class Physics:
    """Bounds for one model in one dtype on one GPU type."""

    model: ModelSpec
    gpu: GPUSpec
    dtype: str

    @property
    def peak(self) -> float:
        return self.gpu.peak_flops(self.dtype if self.dtype in self.gpu.flops else "fp16")

    def decode_step(self, tp: int) -> tuple[float, str]:
        w = weight_bytes_per_gpu(self.model, self.dtype, tp)
        t = w / self.gpu.hbm_bandwidth
        return t, (
            f"a decode step reads each GPU's weights once: {w / GiB:.2f} GiB ÷ "
            f"{self.gpu.hbm_bandwidth / 1e9:,.0f} GB/s = {t * 1e3:.2f} ms (TP={tp})"
        )

    def prefill_flops(self, tokens: np.ndarray | int) -> np.ndarray:
        n = np.asarray(tokens, dtype=float)
        m = self.model
        attention = 4.0 * m.num_layers * m.num_attention_heads * m.head_dim * n * (n + 1) / 2
        return m.linear_flops_per_token() * n + attention + m.lm_head_flops_per_token()

    def prefill_time(self, tokens: np.ndarray | int, tp: int) -> np.ndarray:
        compute = self.prefill_flops(tokens) / (tp * self.peak)
        weights = weight_bytes_per_gpu(self.model, self.dtype, tp) / self.gpu.hbm_bandwidth
        return np.maximum(compute, weights)

    def flops_per_request(self, profile: WorkloadProfile) -> float:
        """Mean FLOPs of a request: its prompt (minus what a cache could serve) and output."""
        new = profile.new_tokens()
        per_token = self.model.linear_flops_per_token()
        return float(per_token * (new + profile.outputs).mean())

    def fleet_rate(self, profile: WorkloadProfile, num_gpus: int) -> float:
        return num_gpus * self.peak / self.flops_per_request(profile)


def check_slo(
    phys: Physics,
    profile: WorkloadProfile,
    max_tp: int,
    num_gpus: int,
    slo_ttft: float | None,
    slo_itl: float | None,
    percentile: float,
    classes: frozenset[str] | None = None,
) -> list[Finding]:
    out = []
    if slo_itl is not None:
        t, how = phys.decode_step(max_tp)
        out.append(
            Finding(
                "itl-slo",
                slo_itl >= t,
                slo_itl,
                t,
                f"ITL P{percentile:g} <= {slo_itl * 1e3:g} ms vs the decode bound: {how}",
            )
        )
    if slo_ttft is not None:
        new = profile.new_tokens()[profile.mask(classes)]
        bounds = phys.prefill_time(new, max_tp)
        b = float(np.percentile(bounds, percentile, method="inverted_cdf"))
        n = int(np.percentile(new, percentile, method="inverted_cdf"))
        out.append(
            Finding(
                "ttft-slo",
                slo_ttft >= b,
                slo_ttft,
                b,
                f"TTFT P{percentile:g} <= {slo_ttft:g} s vs the prefill bound: the "
                f"P{percentile:g} prompt needs {n:,} new tokens × "
                f"{phys.model.linear_flops_per_token() / 1e9:.1f} GFLOP (+ attention) on "
                f"{max_tp} × {phys.peak / 1e12:.0f} TFLOP/s = {b * 1e3:.0f} ms alone on an idle "
                f"replica of TP={max_tp}",
            )
        )
    if slo_ttft is not None:
        f = burst_bound(phys, profile, num_gpus, slo_ttft, percentile, classes)
        if f is not None:
            out.append(f)
    return out


def burst_bound(
    phys: Physics,
    profile: WorkloadProfile,
    num_gpus: int,
    slo_ttft: float,
    percentile: float,
    classes: frozenset[str] | None,
) -> Finding | None:
    b = profile.burst
    share = profile.burst_share(classes)
    if b is None or share == 0:
        return None
    fleet = num_gpus * phys.peak
    cum = np.cumsum(phys.prefill_flops(np.array(b.new_tokens)))
    first_token = cum / fleet  # k-th first token of the burst, earliest possible
    n = b.size
    allowed = 1 - percentile / 100  # share of requests that may miss
    late = n - int(np.searchsorted(first_token, slo_ttft, side="right"))
    late_share = share * late / n
    k_star = math.ceil(n * (1 - allowed / share)) if share > allowed else 0
    least = float(first_token[k_star - 1]) if k_star > 0 else 0.0
    total = sum(b.new_tokens)
    text = (
        f"bursts: {b.size} requests ({', '.join(b.classes)}) arrive at once with {total:,} "
        f"prompt tokens to prefill = {cum[-1] / 1e15:.2f} PFLOP; the whole fleet at peak "
        f"({num_gpus} × {phys.peak / 1e12:.0f} TFLOP/s) needs {first_token[-1]:.1f} s for them, "
        f"so at least {late} of each burst wait > {slo_ttft:g} s; bursts carry {share:.1%} of "
        f"the requests, so >= {late_share:.1%} of requests miss the TTFT SLO where "
        f"P{percentile:g} allows {allowed:.0%}: TTFT P{percentile:g} >= {least:.1f} s"
    )
    return Finding("burst", late_share <= allowed, slo_ttft, least, text)


def check_target(
    phys: Physics, profile: WorkloadProfile, target_rate: float, num_gpus: int
) -> Finding:
    bound = phys.fleet_rate(profile, num_gpus)
    per_req = phys.flops_per_request(profile)
    need = math.ceil(target_rate * per_req / phys.peak)
    return Finding(
        "target-rate",
        target_rate <= bound,
        target_rate,
        bound,
        f"{target_rate:g} req/s × {per_req / 1e12:.1f} TFLOP per request (mean prompt + output "
        f"× {phys.model.linear_flops_per_token() / 1e9:.1f} GFLOP/token) needs >= {need} × "
        f"{phys.peak / 1e12:.0f} TFLOP/s at peak; {num_gpus} GPUs bound the rate at "
        f"{bound:.1f} req/s",
    )


def check_claims(
    phys: Physics, profile: WorkloadProfile, claims: dict[str, float], max_tp: int, num_gpus: int
) -> list[Finding]:
    out = []
    for key, value in claims.items():
        if key == "itl":
            t, how = phys.decode_step(max_tp)
            out.append(
                Finding("claim-itl", value >= t, value, t, f"claimed ITL {value * 1e3:g} ms: {how}")
            )
        elif key == "ttft":
            b = float(np.median(phys.prefill_time(profile.new_tokens(), max_tp)))
            out.append(
                Finding(
                    "claim-ttft",
                    value >= b,
                    value,
                    b,
                    f"claimed median TTFT {value:g} s: the median prompt alone needs "
                    f"{b * 1e3:.0f} ms at peak on TP={max_tp}",
                )
            )
        elif key == "throughput":
            rate = phys.fleet_rate(profile, num_gpus)
            b = rate * profile.mean_output
            out.append(
                Finding(
                    "claim-throughput",
                    value <= b,
                    value,
                    b,
                    f"claimed {value:,.0f} output tok/s: at peak, {num_gpus} GPUs serve at most "
                    f"{rate:.1f} req/s of this workload × {profile.mean_output:.0f} output "
                    f"tokens = {b:,.0f} tok/s",
                )
            )
        elif key == "rate":
            f = check_target(phys, profile, value, num_gpus)
            out.append(Finding("claim-rate", f.ok, value, f.bound, "claimed " + f.text))
        else:
            raise ValueError(f"unknown claim {key!r}; use one of {', '.join(CLAIM_KEYS)}")
    return out


def check_prediction(
    phys: Physics,
    profile: WorkloadProfile,
    tp: int,
    num_gpus: int,
    itl_p50: float | None,
    output_throughput: float,
) -> list[Finding]:
    """The planner's own prediction against the bounds (a failure here is a bug)."""
    t, how = phys.decode_step(tp)
    rate = phys.fleet_rate(profile, num_gpus)
    cap = rate * profile.mean_output
    out = []
    if itl_p50 is not None:
        out.append(
            Finding(
                "predicted-itl",
                itl_p50 >= t,
                itl_p50,
                t,
                f"predicted ITL P50 {itl_p50 * 1e3:.1f} ms >= {t * 1e3:.2f} ms: {how}",
            )
        )
    out.append(
        Finding(
            "predicted-throughput",
            output_throughput <= cap,
            output_throughput,
            cap,
            f"predicted {output_throughput:,.0f} output tok/s <= {cap:,.0f} tok/s, the compute "
            f"bound of {num_gpus} GPUs on this workload",
        )
    )
    return out
