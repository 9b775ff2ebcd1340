"""Session affinity: consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam)."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from servefleet.routing.base import (
    ReplicaViews,
    RequestContext,
    RoutingPolicy,
    Selection,
    stable_hash,
)
from servefleet.routing.load_index import bounded_load_cap, load_index
from servefleet.routing.simple import LeastOutstanding


class ConsistentHash(RoutingPolicy):
    """Rule: a request with a session key goes to the first replica clockwise from the key's
    point on a ring of virtual nodes whose load stays within ``ceil(c × (total + 1) / n)``;
    a fuller replica passes the key on along the ring. Requests without a key go to the least
    loaded replica. Adding or removing a replica moves only the keys it must."""

    name = "session-hash"

    def __init__(self, load_factor: float = 1.25, vnodes: int = 160) -> None:
        if load_factor < 1.0:
            raise ValueError(f"load_factor must be >= 1.0, got {load_factor}")
        self.load_factor = load_factor
        self.vnodes = vnodes
        self._ring_names: tuple[str, ...] = ()
        self._points: list[int] = []
        self._owners: list[str] = []
        self._fallback = LeastOutstanding()

    def _ring(self, names: tuple[str, ...]) -> None:
        if names is self._ring_names or names == self._ring_names:
            return
        pts = sorted((stable_hash(f"{n}#{i}"), n) for n in names for i in range(self.vnodes))
        self._points = [p for p, _ in pts]
        self._owners = [n for _, n in pts]
        self._ring_names = names

    def select(self, replicas: ReplicaViews, ctx: RequestContext) -> Selection | None:
        idx = load_index(replicas)
        if not idx.has_available():
            return None
        if ctx.session_key is None:
            return self._fallback.select(idx, ctx)
        self._ring(idx.sorted_names)
        cap = bounded_load_cap(idx, self.load_factor)
        start = bisect.bisect(self._points, stable_hash(ctx.session_key))
        n = len(self._owners)
        seen: set[str] = set()
        for i in range(n):
            owner = self._owners[(start + i) % n]
            if owner in seen:
                continue
            seen.add(owner)
            r = idx.named(owner)
            if r is not None and r.available and r.in_flight + 1 <= cap:
                return Selection(r, self.name)
            if len(seen) == len(idx):
                break
        return self._fallback.select(idx, ctx)

    def home(self, names: Sequence[str], session_key: str) -> str:
        """The replica a key maps to with no load bound (for tests and explanations)."""
        self._ring(tuple(sorted(names)))
        i = bisect.bisect(self._points, stable_hash(session_key)) % len(self._owners)
        return self._owners[i]
