"""Where throughput stops growing and latency explodes: the knee of a sweep.

Rule (one for ``bench``, ``simulate``, ``report`` and ``plan``): walk the sweep in ascending
load (concurrency or request rate). For each step from point i-1 to point i, compare what it
bought with what it cost, as ratios:

    gain  = throughput_i / throughput_{i-1}        (output tokens/s)
    cost  = ttft_p95_i  / ttft_p95_{i-1}

The knee is the first point i whose step costs much and buys little: TTFT P95 grew by more than
``min_latency_growth`` (50 %) **and** it grew at least ``elasticity`` (3) times faster than
throughput in log terms, ``log(cost) >= elasticity × log(gain)`` (always true when throughput
did not grow). Log ratios make the rule independent of the step size: doubling concurrency
for +23 % throughput at 5.7 × the TTFT is ``log 5.7 / log 1.23 = 8.5``; on the rising part of
a curve the ratio is below 1.

    throughput                          TTFT P95
      │           ●──●  ← knee             │              ●  ← knee
      │       ●                            │
      │   ●                                │  ●   ●   ●
      └──────────── load                   └──────────── load
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KneeRule:
    elasticity: float = 3.0
    """TTFT P95 must grow at least this many times faster than throughput (log ratios)."""
    min_latency_growth: float = 0.5
    """... and by more than this fraction (a small latency change is never a knee)."""

    def describe(self) -> str:
        return (
            f"the knee is the first point whose step from the previous one grows TTFT P95 by "
            f"more than {self.min_latency_growth:.0%} and at least {self.elasticity:g}x faster "
            "than throughput (log ratios; docs/metrics.md)"
        )

    def is_knee(self, gain: float, cost: float) -> bool:
        """A step that multiplied throughput by ``gain`` and TTFT P95 by ``cost``."""
        if cost <= 1 + self.min_latency_growth:
            return False
        return gain <= 1 or math.log(cost) >= self.elasticity * math.log(gain)


def find_knee(
    loads: Sequence[float],
    throughput: Sequence[float],
    ttft_p95: Sequence[float | None],
    rule: KneeRule | None = None,
) -> int | None:
    """Index of the knee under ``rule`` (loads ascending), or None if the sweep never
    saturates. Steps with a missing or zero figure, or no load increase, are skipped."""
    rule = rule or KneeRule()
    for i in range(1, len(throughput)):
        t0, t1, l0, l1 = throughput[i - 1], throughput[i], ttft_p95[i - 1], ttft_p95[i]
        if loads[i] <= loads[i - 1] or not t0 or t0 <= 0 or l0 is None or l1 is None or l0 <= 0:
            continue
        if rule.is_knee(max(t1, 0.0) / t0, l1 / l0):
            return i
    return None
