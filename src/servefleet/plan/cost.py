"""GPU prices → cost per month and per million tokens; GPUs needed for a target rate."""

from __future__ import annotations

import math
from dataclasses import dataclass

HOURS_PER_MONTH = 730.0
"""365 × 24 / 12."""


@dataclass(frozen=True, slots=True)
class CostEstimate:
    gpus: int
    price_per_gpu_hour: float
    per_month: float
    per_million_output_tokens: float
    per_million_tokens: float
    """Prompt + output tokens."""
    text: str

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}


def cost_estimate(
    gpus: int, price_per_gpu_hour: float, output_tok_s: float, total_tok_s: float
) -> CostEstimate:
    per_hour = gpus * price_per_gpu_hour
    month = per_hour * HOURS_PER_MONTH
    per_out = per_hour / 3600 / output_tok_s * 1e6 if output_tok_s > 0 else math.inf
    per_all = per_hour / 3600 / total_tok_s * 1e6 if total_tok_s > 0 else math.inf
    text = (
        f"{gpus} GPUs × ${price_per_gpu_hour:g}/h = ${per_hour:,.2f}/h × {HOURS_PER_MONTH:g} h = "
        f"${month:,.0f} per month; at {output_tok_s:,.0f} output tok/s that is "
        f"${per_hour:,.2f} ÷ 3600 ÷ {output_tok_s:,.0f} × 10^6 = ${per_out:,.3f} per million "
        f"output tokens (${per_all:,.3f} per million prompt + output tokens, at {total_tok_s:,.0f} tok/s)"
    )
    return CostEstimate(gpus, price_per_gpu_hour, month, per_out, per_all, text)


@dataclass(frozen=True, slots=True)
class Capacity:
    target_rate: float
    rate_per_replica: float
    replicas: int
    gpus: int
    available_gpus: int
    text: str
    verified: bool | None = None
    """Whether a simulation of ``replicas`` at the target rate met the SLO (None: not run)."""
    verify_text: str = ""

    @property
    def fits_inventory(self) -> bool:
        return self.gpus <= self.available_gpus

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__} | {
            "fits_inventory": self.fits_inventory
        }


def gpus_needed(
    target_rate: float, max_rate: float, replicas: int, tp: int, available: int
) -> Capacity:
    per_replica = max_rate / replicas
    need = max(1, math.ceil(target_rate / per_replica - 1e-9))
    text = (
        f"{target_rate:g} req/s ÷ {per_replica:.3g} req/s per replica ({max_rate:g} req/s "
        f"sustained by {replicas} replicas under the SLO) = {target_rate / per_replica:.2f} → "
        f"{need} replica(s) × TP={tp} = {need * tp} GPUs"
    )
    text += (
        f" (of the {available} available)"
        if need * tp <= available
        else f": {need * tp - available} more than the {available} available"
    )
    return Capacity(target_rate, per_replica, need, need * tp, available, text)
