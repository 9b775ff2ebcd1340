"""Does a rate hold, or does the queue grow? The planner's sustainability criterion, on the
records of one long simulated point (pure: records in, a verdict out; no simulation here).

Rule: a rate holds on one seed when, over a long measured window (``long_timing``),

1. the SLO is met over the window (``search.judge``), **and** over its last third alone (with
   bursts: its last whole burst periods covering a third): a latency that creeps up shows
   first at the end of the window;
2. the fleet keeps up: requests finished inside the window ≥ ``MIN_FINISHED_SHARE`` (97 %) of
   the requests sent inside it (a refused request never finishes, so it counts against);
3. the queue shows no upward trend: the number of requests waiting for their first token,
   time-averaged over ``TREND_BINS`` equal bins of the window, has a Theil–Sen slope (the
   median of the slopes between every pair of bins: robust to a burst or two) whose growth
   across the window, ``slope × window``, is at most ``max(TREND_MIN_GROWTH, TREND_REL_GROWTH
   × the mean waiting)``: a queue may wobble, not climb;
4. the run was not stopped early: ``stop_waiting`` gives up on a point as soon as more requests
   wait for their first token than ``STOP_FACTOR × rate × TTFT SLO`` plus one burst — at that
   queue a newly arrived request waits several SLOs, so the point is clearly failing.

A rate holds when it holds on every seed tried (``Sustained``). Time-series here are fleet-wide.

    waiting
      │            ╱╲    ╱╲╱╲  ╱      grows: slope × window > bound → ✗
      │   ╱╲  ╱╲╱╲╱  ╲╱      ╲╱
      │╱╲╱  ╲╱                      wobbles: slope ≈ 0             → ✓
      └──────────────────────── t
       warm-up │  window (bins)  │
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from servefleet.records import RequestRecord
from servefleet.stats import Window

TREND_BINS = 12
TREND_MIN_GROWTH = 2.0
"""Requests: a growth of the fleet's waiting queue below this is noise, whatever its slope."""
TREND_REL_GROWTH = 0.5
"""A growth across the window of more than half the mean waiting queue is a trend."""
MIN_FINISHED_SHARE = 0.97
TAIL_FRACTION = 1 / 3
"""The last third of the window must meet the SLO on its own."""
STOP_FACTOR = 5.0


@dataclass(frozen=True, slots=True)
class Trend:
    """The waiting queue across the window: per-bin means, Theil–Sen slope (requests per
    second) and the growth it implies across the window."""

    means: tuple[float, ...]
    slope: float
    growth: float
    bound: float

    @property
    def rising(self) -> bool:
        return self.growth > self.bound

    def describe(self) -> str:
        verb = "grows" if self.rising else "stays level"
        return (
            f"the waiting queue {verb}: Theil–Sen slope {self.slope * 60:+.2f} requests/min, "
            f"{self.growth:+.1f} across the window (bound {self.bound:.1f}; mean "
            f"{float(np.mean(self.means)):.1f})"
        )


def waiting_means(records: Sequence[RequestRecord], window: Window, bins: int) -> np.ndarray:
    """Per bin of ``window``: the time-averaged number of requests that had been sent and had
    not yet received their first token (a refused request waits for nothing)."""
    edges = np.linspace(window.start, window.end, bins + 1)
    starts, ends = [], []
    for r in records:
        if r.first_token_time is None or not r.ok:
            continue
        if r.first_token_time > window.start and r.send_time < window.end:
            starts.append(r.send_time)
            ends.append(r.first_token_time)
    if not starts:
        return np.zeros(bins)
    s, e = np.asarray(starts)[:, None], np.asarray(ends)[:, None]
    overlap = np.clip(np.minimum(e, edges[1:]) - np.maximum(s, edges[:-1]), 0.0, None)
    return overlap.sum(axis=0) / np.diff(edges)


def theil_sen(y: Sequence[float]) -> float:
    """The median of the slopes between every pair of points ``(i, y[i])`` (per index)."""
    a = np.asarray(y, dtype=float)
    i, j = np.triu_indices(a.size, k=1)
    return float(np.median((a[j] - a[i]) / (j - i))) if i.size else 0.0


def trend(records: Sequence[RequestRecord], window: Window, bins: int = TREND_BINS) -> Trend:
    means = waiting_means(records, window, bins)
    per_bin = theil_sen(means)
    slope = per_bin * bins / window.length
    growth = per_bin * (bins - 1)
    bound = max(TREND_MIN_GROWTH, TREND_REL_GROWTH * float(means.mean()))
    return Trend(tuple(float(m) for m in means), slope, growth, bound)


def finished_share(records: Sequence[RequestRecord], window: Window) -> float:
    """Requests that finished ok inside ``window`` ÷ requests sent inside it (1.0 if none)."""
    sent = sum(1 for r in records if window.start <= r.send_time < window.end)
    done = sum(
        1
        for r in records
        if r.ok and r.end_time is not None and window.start <= r.end_time < window.end
    )
    return min(1.0, done / sent) if sent else 1.0


def tail_window(window: Window, period: float | None = None) -> Window:
    """The last third of ``window``; with bursts every ``period`` seconds, the last whole
    periods that cover at least a third of it (a third cut mid-period would hold a burst's
    share of late requests more, or less, than the window does)."""
    if period and period < window.length:
        n = max(1, round(window.length / period))
        k = max(1, math.ceil(n * TAIL_FRACTION))
        if k < n:
            return Window(window.end - k * period, window.end)
    return Window(window.end - window.length * TAIL_FRACTION, window.end)


def stop_bound(rate: float, slo_ttft: float | None, burst: int) -> int | None:
    """Requests waiting for their first token past which a point is clearly failing."""
    if slo_ttft is None:
        return None
    return math.ceil(STOP_FACTOR * rate * slo_ttft) + burst + 8
