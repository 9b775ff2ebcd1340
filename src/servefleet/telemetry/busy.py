"""The simulator's GPU busy fraction over time: the share of each time bin in which an engine
step was running (pure). A replica's steps never overlap, so the fraction is at most 1."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def busy_fraction(
    starts: Sequence[float], ends: Sequence[float], t0: float, t1: float, bins: int = 100
) -> tuple[list[float], list[float]]:
    """(bin centres, busy fraction per bin) of the intervals ``[starts[i], ends[i])`` over
    ``[t0, t1)`` cut into ``bins`` equal bins."""
    if t1 <= t0 or bins < 1:
        return [], []
    edges = np.linspace(t0, t1, bins + 1)
    s = np.asarray(starts, dtype=float)
    e = np.asarray(ends, dtype=float)
    # busy time before each edge: sum over intervals of clip(edge - start, 0, duration)
    dur = np.maximum(e - s, 0.0)
    cum = np.array([np.clip(x - s, 0.0, dur).sum() for x in edges])
    frac = np.diff(cum) / np.diff(edges)
    centres = (edges[:-1] + edges[1:]) / 2
    return centres.tolist(), np.clip(frac, 0.0, 1.0).tolist()


def busy_series(
    replicas: Sequence[tuple[str, Sequence[float], Sequence[float]]],
    t0: float,
    t1: float,
    bins: int = 100,
):
    """The simulator's per-replica busy share over ``[t0, t1)``, as the ``GpuSeries`` a bench
    point records (kind ``modelled``, utilization in %): (name, step starts, step ends) per
    replica."""
    from servefleet.telemetry.series import GpuSeries

    s = GpuSeries("simulator (engine steps)", "modelled")
    cols = [(name, busy_fraction(st, en, t0, t1, bins)) for name, st, en in replicas]
    if not cols or not cols[0][1][0]:
        return s
    for i, t in enumerate(cols[0][1][0]):
        s.add(
            t,
            {
                name: {
                    "gpu": "",
                    "name": "modelled",
                    "replica": name,
                    "readings": {"utilization": 100.0 * frac[i]},
                }
                for name, (_, frac) in cols
            },
        )
    return s
