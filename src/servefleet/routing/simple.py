"""Load-spreading policies that need no request content."""

from __future__ import annotations

import random
from collections.abc import Sequence

from servefleet.routing.base import ReplicaView, RequestContext, available


class RoundRobin:
    """Rule: the next available replica after the one chosen last, in name order."""

    name = "round-robin"

    def __init__(self) -> None:
        self._next = 0

    def select(self, replicas: Sequence[ReplicaView], ctx: RequestContext) -> ReplicaView | None:
        cands = available(replicas)
        if not cands:
            return None
        choice = cands[self._next % len(cands)]
        self._next += 1
        return choice


class LeastOutstanding:
    """Rule: the available replica with the fewest in-flight requests (or tokens); ties go to
    the first in order."""

    def __init__(self, by: str = "requests") -> None:
        if by not in ("requests", "tokens"):
            raise ValueError(f"least-outstanding: by must be 'requests' or 'tokens', got {by!r}")
        self.by = by
        self.name = "least-outstanding" if by == "requests" else "least-outstanding-tokens"

    def select(self, replicas: Sequence[ReplicaView], ctx: RequestContext) -> ReplicaView | None:
        cands = available(replicas)
        if not cands:
            return None
        if self.by == "requests":
            return min(cands, key=lambda r: (r.in_flight, r.in_flight_tokens))
        return min(cands, key=lambda r: (r.in_flight_tokens, r.in_flight))


class PowerOfTwo:
    """Rule: sample two available replicas at random, take the one with fewer in flight."""

    name = "power-of-two"

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)

    def select(self, replicas: Sequence[ReplicaView], ctx: RequestContext) -> ReplicaView | None:
        cands = available(replicas)
        if len(cands) <= 1:
            return cands[0] if cands else None
        a, b = self._rng.sample(cands, 2)
        return a if a.in_flight <= b.in_flight else b
