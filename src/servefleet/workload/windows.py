"""Measurement windows that contain the workload: a workload with bursts is measured over at
least one whole burst period after the warm-up.

Rule: bursts come every P seconds (at the offered rate; scaling a workload to a rate scales
its periods). A window shorter than P holds at most one burst, and maybe none: a 60 s run of
a workload whose only burst falls inside the warm-up measures the quiet part alone and reports
SLOs held that the next burst breaks. So a window of at least one whole period (the longest
period of the workload's burst processes) is required; one period, wherever it starts, holds
exactly one burst and every phase between two bursts once. Closed loops and traces have no
period (their arrivals are not bursts repeating at a known interval).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .arrivals import Bursts
from .source import _scale, build_groups
from .spec import WorkloadSpec


def burst_period(spec: WorkloadSpec, rate: float | None) -> float | None:
    """Seconds between bursts of the workload scaled to ``rate`` requests/s (None: the rate as
    written), the longest of its burst processes; None without bursts or for a closed loop."""
    if spec.trace is not None:
        return None
    groups = build_groups(spec)
    if rate is not None:
        if not any(not g.closed for g in groups):
            return None
        groups = _scale(groups, rate)
    periods = [g.process.period for g in groups if isinstance(g.process, Bursts)]
    return max(periods) if periods else None


@dataclass(frozen=True, slots=True)
class WindowCheck:
    period: float
    """Seconds between bursts at this rate."""
    duration: float
    """The duration whose window holds one whole period (>= the one asked for)."""
    asked: float

    @property
    def extended(self) -> bool:
        return self.duration > self.asked

    def describe(self, flag: str = "--duration") -> str:
        return (
            f"{flag} extended from {self.asked:g} s to {self.duration:g} s: the window after "
            f"the warm-up must hold one whole burst period ({self.period:.4g} s at this rate), "
            "else it may hold no burst at all"
        )


def whole_period_duration(
    spec: WorkloadSpec, rate: float | None, duration: float, warmup: float, cooldown: float = 0.0
) -> WindowCheck | None:
    """The check of a point of ``duration`` seconds of arrivals measured after ``warmup`` and
    before the last ``cooldown``: None when the workload has no bursts, else the period and
    the duration (``duration``, or longer, rounded up to 0.1 s) whose window holds a whole
    period."""
    period = burst_period(spec, rate)
    if period is None:
        return None
    need = warmup + period + cooldown
    longer = need > duration + 1e-9
    return WindowCheck(period, math.ceil(need * 10) / 10 if longer else duration, duration)
