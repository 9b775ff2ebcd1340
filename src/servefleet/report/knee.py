"""Where throughput stops growing and latency explodes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KneeRule:
    """The knee is the first point where throughput grew by less than ``min_gain_ratio`` of
    the relative load increase (doubling the load but gaining < 20 % throughput) while TTFT P95
    grew by more than ``latency_growth``."""

    min_gain_ratio: float = 0.2
    latency_growth: float = 0.5

    def describe(self) -> str:
        return (
            f"the knee is the first point whose relative throughput gain is < {self.min_gain_ratio:.0%} "
            f"of its relative load increase while TTFT P95 grows > {self.latency_growth:.0%}"
        )


def find_knee(
    loads: Sequence[float],
    throughput: Sequence[float],
    ttft_p95: Sequence[float | None],
    rule: KneeRule | None = None,
) -> int | None:
    """Index of the knee under ``rule`` (loads ascending), or None if the sweep never saturates."""
    rule = rule or KneeRule()
    for i in range(1, len(throughput)):
        prev_t, t, prev_l, lat = throughput[i - 1], throughput[i], ttft_p95[i - 1], ttft_p95[i]
        load_gain = loads[i] / loads[i - 1] - 1 if loads[i - 1] > 0 else 0.0
        if prev_t <= 0 or prev_l is None or lat is None or prev_l <= 0 or load_gain <= 0:
            continue
        if (
            t / prev_t - 1
        ) < rule.min_gain_ratio * load_gain and lat / prev_l - 1 > rule.latency_growth:
            return i
    return None
