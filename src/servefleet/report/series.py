"""Plot data from records (pure): CDFs, in-flight requests and token rate over time."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from servefleet.records import RequestRecord
from servefleet.stats import token_gaps


def cdf(values: Sequence[float], points: int = 200) -> tuple[list[float], list[float]]:
    """(x, F(x)) at up to ``points`` quantiles."""
    a = np.sort(np.asarray(values, dtype=float))
    if a.size == 0:
        return [], []
    q = np.linspace(0, 1, min(points, a.size))
    xs = np.quantile(a, q)
    return xs.tolist(), q.tolist()


def ttft_values(records: Sequence[RequestRecord]) -> list[float]:
    return [r.ttft for r in records if r.ok and r.ttft is not None]


def e2e_values(records: Sequence[RequestRecord]) -> list[float]:
    return [r.e2e_latency for r in records if r.ok and r.e2e_latency is not None]


def itl_values(records: Sequence[RequestRecord]) -> np.ndarray:
    parts = [token_gaps(r)[0] for r in records if r.ok]
    return np.concatenate(parts) if parts else np.empty(0)


def in_flight(
    records: Sequence[RequestRecord], points: int = 300
) -> tuple[list[float], list[float]]:
    """Requests sent and not yet ended, sampled at ``points`` instants."""
    spans = [(r.send_time, r.end_time) for r in records if r.end_time is not None]
    if not spans:
        return [], []
    starts = np.sort([s for s, _ in spans])
    ends = np.sort([e for _, e in spans])
    t = np.linspace(starts[0], max(ends[-1], starts[0] + 1e-9), points)
    n = np.searchsorted(starts, t, "right") - np.searchsorted(ends, t, "right")
    return t.tolist(), n.astype(float).tolist()


def token_rate(
    records: Sequence[RequestRecord], bins: int = 100, min_width: float = 0.25
) -> tuple[list[float], list[float]]:
    """Output tokens/s in up to ``bins`` equal bins of at least ``min_width`` s (bin centres)."""
    times = [t for r in records for t in r.chunk_times]
    if not times:
        return [], []
    toks = [k for r in records for k in r.chunk_tokens]
    lo, hi = min(times), max(times)
    width = max((hi - lo) / bins, min_width)
    edges = np.arange(lo, hi + width, width)
    if edges.size < 2:
        edges = np.array([lo, lo + width])
    h, e = np.histogram(times, bins=edges, weights=toks)
    return ((e[:-1] + e[1:]) / 2).tolist(), (h / width).tolist()
