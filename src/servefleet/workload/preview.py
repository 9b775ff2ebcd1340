"""Running a source against a fixed service time: a pure, instant look at what a workload sends
(for tests, docs and ``--dry-run``; the simulator is the faithful version)."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from itertools import count

from .types import RequestSpec, WorkloadSource

_FINISH, _ARRIVE = 0, 1  # at equal times, finishes first


def dry_run(
    source: WorkloadSource,
    *,
    until: float,
    latency: float | Callable[[RequestSpec], float] = 0.0,
    output_tokens: Callable[[RequestSpec], int] | None = None,
) -> list[RequestSpec]:
    """Every request sent before ``until`` (in send order), each served in ``latency`` seconds
    and producing ``output_tokens(spec)`` tokens (default: its ``max_tokens``)."""
    lat = latency if callable(latency) else (lambda _s: latency)
    out = output_tokens or (lambda s: s.max_tokens)
    initial, seq, heap, sent = iter(source.initial()), count(), [], []

    def pull() -> None:
        s = next(initial, None)
        if s is not None:
            heapq.heappush(heap, (s.arrival_time, _ARRIVE, next(seq), s, True))

    pull()
    while heap:
        t, kind, _, spec, first = heapq.heappop(heap)
        if kind == _FINISH:
            for f in source.on_finish(spec, t, out(spec)):
                heapq.heappush(heap, (f.arrival_time, _ARRIVE, next(seq), f, False))
            continue
        if t >= until:
            break
        if first:
            pull()
        sent.append(spec)
        heapq.heappush(heap, (t + lat(spec), _FINISH, next(seq), spec, False))
    return sent
