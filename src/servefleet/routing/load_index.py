"""The replicas a policy picks from, with the answers policies ask of them kept incrementally.

Policies ask the same few questions of the replicas for every request: which are available,
which is least loaded (by requests or by tokens), how many requests are in flight in all. A
scan answers each in O(n); a fleet simulator routing a million requests over a thousand
replicas would spend most of its time scanning. ``LoadIndex`` answers them from state it
keeps up to date:

* ``available()``: the views in order, the caller's list itself while none is unavailable;
* ``least(by)``: a heap per key with lazy deletion: an update pushes a new entry and bumps
  the view's version; a query pops entries whose version is old or whose view is not
  available (an update re-pushes it when it becomes so); the heap is rebuilt when stale
  entries outnumber the live ones;
* ``total_in_flight``, ``named(name)``, ``sorted_names``.

A caller that keeps one index across requests (the simulator) calls ``update(view)`` after
it changes a view's ``in_flight``, ``in_flight_tokens``, ``ready`` or ``max_in_flight``; each
answer then costs O(log n) or O(1). A caller that hands a policy a plain sequence of views (the
gateway, which rebuilds its views per request) gets a fresh index per call from
``load_index``, which costs one pass, as the scan did. ``tests/test_load_index.py`` checks the
answers against the scans on random updates.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Sequence
from typing import Literal, overload

from servefleet.routing.base import ReplicaView

LoadKey = Literal["requests", "tokens"]
_REBUILD_SLACK = 16


def _key(by: LoadKey, v: ReplicaView) -> tuple[int, int]:
    """Least loaded first; ``least`` breaks ties by position (the first in order wins)."""
    if by == "requests":
        return (v.in_flight, v.in_flight_tokens)
    return (v.in_flight_tokens, v.in_flight)


class LoadIndex(Sequence[ReplicaView]):
    """A fixed list of replica views and incremental answers about them (module docstring)."""

    __slots__ = (
        "_avail",
        "_avail_names",
        "_by_name",
        "_heaps",
        "_in_flight",
        "_names",
        "_pos",
        "_unavailable",
        "_version",
        "_views",
        "total_in_flight",
    )

    def __init__(self, views: Sequence[ReplicaView]) -> None:
        self._views = list(views)
        self._pos = {id(v): i for i, v in enumerate(self._views)}
        self._avail = [v.available for v in self._views]
        self._unavailable = self._avail.count(False)
        self._in_flight = [v.in_flight for v in self._views]
        self.total_in_flight = sum(self._in_flight)
        """Requests in flight on all the replicas (available or not)."""
        self._version = [0] * len(self._views)
        self._heaps: dict[LoadKey, list[tuple[int, int, int, int]]] = {}
        self._by_name: dict[str, ReplicaView] | None = None
        self._names: tuple[str, ...] | None = None
        self._avail_names: frozenset[str] | None = None

    # -- the sequence ------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._views)

    @overload
    def __getitem__(self, i: int) -> ReplicaView: ...
    @overload
    def __getitem__(self, i: slice) -> list[ReplicaView]: ...
    def __getitem__(self, i):
        return self._views[i]

    def __iter__(self) -> Iterator[ReplicaView]:
        return iter(self._views)

    # -- keeping it up to date ---------------------------------------------------------------
    def update(self, view: ReplicaView) -> None:
        """``view`` changed its load or availability."""
        i = self._pos[id(view)]
        self.total_in_flight += view.in_flight - self._in_flight[i]
        self._in_flight[i] = view.in_flight
        ok = view.available
        if ok != self._avail[i]:
            self._avail[i] = ok
            self._unavailable += -1 if ok else 1
            self._avail_names = None
        ver = self._version[i] = self._version[i] + 1
        if not ok:
            return
        for by, heap in self._heaps.items():
            heapq.heappush(heap, (*_key(by, view), i, ver))
            if len(heap) > 2 * len(self._views) + _REBUILD_SLACK:
                self._heaps[by] = self._build(by)

    def _build(self, by: LoadKey) -> list[tuple[int, int, int, int]]:
        ver, views = self._version, self._views
        heap = [(*_key(by, views[i]), i, ver[i]) for i in range(len(views)) if self._avail[i]]
        heapq.heapify(heap)
        return heap

    # -- the answers -------------------------------------------------------------------------
    def available(self) -> Sequence[ReplicaView]:
        """The available views, in order (do not modify: it may be the index's own list)."""
        if not self._unavailable:
            return self._views
        return [v for v, ok in zip(self._views, self._avail, strict=True) if ok]

    def least(self, by: LoadKey = "requests") -> ReplicaView | None:
        """The available view with the fewest requests in flight (then the fewest tokens), or
        with ``by="tokens"`` the fewest tokens (then requests); ties: the first in order."""
        heap = self._heaps.get(by)
        if heap is None:
            heap = self._heaps[by] = self._build(by)
        ver, avail = self._version, self._avail
        while heap:
            _, _, i, v = heap[0]
            if v == ver[i] and avail[i]:
                return self._views[i]
            heapq.heappop(heap)
        return None

    def position(self, view: ReplicaView) -> int:
        return self._pos[id(view)]

    @property
    def available_names(self) -> frozenset[str]:
        """Names of the available views (kept while no view's availability changes)."""
        if self._avail_names is None:
            self._avail_names = frozenset(v.name for v in self.available())
        return self._avail_names

    def named(self, name: str) -> ReplicaView | None:
        if self._by_name is None:
            self._by_name = {v.name: v for v in self._views}
        return self._by_name.get(name)

    @property
    def sorted_names(self) -> tuple[str, ...]:
        if self._names is None:
            self._names = tuple(sorted(v.name for v in self._views))
        return self._names


def load_index(replicas: Sequence[ReplicaView]) -> LoadIndex:
    """The caller's index if it keeps one, else a fresh index of these views."""
    return replicas if isinstance(replicas, LoadIndex) else LoadIndex(replicas)


def bounded_load_cap(replicas: Sequence[ReplicaView], load_factor: float) -> int:
    """``ceil(c × (total in flight + 1) / n)``: the most a replica may hold before a sticky
    policy passes a request on (consistent hashing with bounded loads)."""
    idx = load_index(replicas)
    return math.ceil(load_factor * (idx.total_in_flight + 1) / max(1, len(idx)))
