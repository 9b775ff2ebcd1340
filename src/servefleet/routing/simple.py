"""Load-spreading policies that need no request content."""

from __future__ import annotations

import random

from servefleet.routing.base import ReplicaViews, RequestContext, RoutingPolicy, Selection
from servefleet.routing.load_index import load_index


class RoundRobin(RoutingPolicy):
    """Rule: the next available replica after the one chosen last, in name order."""

    name = "round-robin"

    def __init__(self) -> None:
        self._next = 0

    def select(self, replicas: ReplicaViews, ctx: RequestContext) -> Selection | None:
        cands = load_index(replicas).available()
        if not cands:
            return None
        choice = cands[self._next % len(cands)]
        self._next += 1
        return Selection(choice, self.name)


class LeastOutstanding(RoutingPolicy):
    """Rule: the available replica with the fewest in-flight requests (or tokens); ties go to
    the first in order."""

    def __init__(self, by: str = "requests") -> None:
        if by not in ("requests", "tokens"):
            raise ValueError(f"least-outstanding: by must be 'requests' or 'tokens', got {by!r}")
        self.by = by
        self.name = "least-outstanding" if by == "requests" else "least-outstanding-tokens"

    def select(self, replicas: ReplicaViews, ctx: RequestContext) -> Selection | None:
        best = load_index(replicas).least(self.by)
        return Selection(best, self.name) if best is not None else None


class PowerOfTwo(RoutingPolicy):
    """Rule: sample two available replicas at random, take the one with fewer in flight."""

    name = "power-of-two"

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)

    def select(self, replicas: ReplicaViews, ctx: RequestContext) -> Selection | None:
        cands = load_index(replicas).available()
        if len(cands) <= 1:
            return Selection(cands[0], self.name) if cands else None
        a, b = self._rng.sample(cands, 2)
        return Selection(a if a.in_flight <= b.in_flight else b, self.name)
