"""The replicas a policy picks from, with the answers policies ask of them kept incrementally.

Policies ask the same few questions of the replicas for every request: which are available,
which is least loaded (by requests or by tokens), how many requests are in flight in all. A
scan answers each in O(n); a fleet simulator routing a million requests over a thousand
replicas would spend most of its time scanning. ``LoadIndex`` answers them from state it
keeps up to date:

* ``available()``: the views in order, the caller's list itself while none is unavailable,
  else a list kept until a view's availability or membership changes;
* ``least(by)``: a heap per key with lazy deletion: an update pushes a new entry (the view's
  load and position packed into one int) and notes it as the view's current key; a query
  pops entries that are not a view's current key or whose view is not available (an update
  re-pushes it when it becomes so); the heap is rebuilt when stale entries outnumber the
  live ones;
* ``total_in_flight``, ``named(name)``, ``sorted_names``, ``available_names`` (a container).

A caller that keeps one index across requests (the simulator) calls ``update(view)`` after
it changes a view's ``in_flight``, ``in_flight_tokens``, ``ready``, ``max_in_flight`` or
``latency_scale``, and, if it says ``tracks_prefills=True``, ``pending_prefills`` and
``pending_prefill_tokens``; each answer then costs O(log n) or O(1). A caller that hands a policy a plain sequence of views (the
gateway, which rebuilds its views per request) gets a fresh index per call from
``load_index``, which costs one pass, as the scan did; such an index is not ``kept``.

Two extensions serve policies whose questions are their own:

* ``subset(positions)``: a kept index of some of the views (a pool), with the same answers,
  updated through its parent; ``set_member`` moves a view in or out in O(log n);
* ``companion(key, build)``: an object a policy keeps next to a kept index (e.g. the TTFT
  search of predicted latency); ``update`` tells it ``(position, view, in_index)``.

``tests/test_load_index.py`` checks the answers against the scans on random updates.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Container, Iterator, Sequence
from typing import Any, Final, Literal, Protocol, TypeVar, overload

from servefleet.routing.base import ReplicaView, ReplicaViews

LoadKey = Literal["requests", "tokens"]
# Final: compiled code reads these as constants (docs/simulate.md, "A compiled core")
heapify: Final = heapq.heapify
heappush: Final = heapq.heappush
heappop: Final = heapq.heappop
_REBUILD_SLACK: Final = 16


class Companion(Protocol):
    def update(self, i: int, view: ReplicaView, in_index: bool) -> None: ...


C = TypeVar("C", bound=Companion)


_LOAD_BITS: Final = 64
"""Bits the second load field takes in a packed key, offset by ``_LOAD_OFFSET`` (requests and
tokens in flight stay far inside)."""
_LOAD_OFFSET: Final = 1 << (_LOAD_BITS - 1)


def _key(by: LoadKey, v: ReplicaView, i: int, position_bits: int) -> int:
    """Least loaded first; ``least`` breaks ties by position (the first in order wins). The
    tuple ``(in_flight, in_flight_tokens, i)`` (tokens first with ``by="tokens"``), packed
    into one int in the same order (a negative load too: the second field is offset into
    ``[0, 2**64)``, the first may take any sign): a heap of ints compares each pair once,
    where tuples compare element by element (most of ``least``'s time, with the fleet's
    loads alike)."""
    if by == "requests":
        first, second = v.in_flight, v.in_flight_tokens
    else:
        first, second = v.in_flight_tokens, v.in_flight
    return (((first << _LOAD_BITS) | (second + _LOAD_OFFSET)) << position_bits) | i


class _AvailableNames:
    """The names of the available views of an index, answered per name in O(1). A
    ``Container`` by registration (below), not by derivation, as ``LoadIndex`` is a
    ``Sequence``."""

    __slots__ = ("_idx",)

    def __init__(self, idx: LoadIndex) -> None:
        self._idx = idx

    def __contains__(self, name: object) -> bool:
        i = self._idx._pos_by_name.get(name)  # type: ignore[arg-type,call-overload]
        return i is not None and self._idx._ok[i]


class LoadIndex:
    """A list of replica views (or a subset of one) and incremental answers about them
    (module docstring).

    A ``Sequence`` of views by registration (below) and by its methods, which are those of
    ``Sequence``: it does not derive from it, being compiled (``servefleet.compiled.MODULES``:
    mypyc would give it ``Sequence``'s ABC registry)."""

    __slots__ = (
        "_available",
        "_companions",
        "_heaps",
        "_in_flight",
        "_keys",
        "_member",
        "_members",
        "_names",
        "_ok",
        "_pos",
        "_pos_by_name",
        "_position_bits",
        "_unavailable",
        "_views",
        "kept",
        "total_in_flight",
        "tracks_prefills",
    )

    def __init__(
        self,
        views: ReplicaViews,
        *,
        kept: bool = True,
        tracks_prefills: bool = False,
        member: list[bool] | None = None,
    ) -> None:
        self._views = list(views)
        self.kept = kept
        """True when the caller keeps this index up to date across requests (``update``)."""
        self.tracks_prefills = tracks_prefills
        """True when the caller also calls ``update`` after a view's pending prefills change
        (a first token); the TTFT search of predicted latency needs it, the rest do not."""
        self._pos = {id(v): i for i, v in enumerate(self._views)}
        self._pos_by_name = {v.name: i for i, v in enumerate(self._views)}
        self._member = member
        inside = member if member is not None else [True] * len(self._views)
        self._ok = [m and v.available for v, m in zip(self._views, inside, strict=True)]
        self._unavailable = sum(1 for m, ok in zip(inside, self._ok, strict=True) if m and not ok)
        self._in_flight = [v.in_flight for v in self._views]
        self.total_in_flight = sum(f for f, m in zip(self._in_flight, inside, strict=True) if m)
        """Requests in flight on the views of this index (available or not)."""
        self._position_bits = len(self._views).bit_length()
        self._heaps: dict[LoadKey, list[int]] = {}
        """Per key asked for: a heap of packed keys (``_key``), some stale."""
        self._keys: dict[LoadKey, list[int]] = {}
        """Per key asked for: each view's key now. A heap entry is stale unless it equals it
        (an entry equal to it is the view's load now, however old)."""
        self._members: list[ReplicaView] | None = self._views if member is None else None
        self._available: list[ReplicaView] | None = None
        """``available()`` while no view's availability or membership has changed since."""
        self._names: tuple[str, ...] | None = None
        self._companions: dict[Any, Companion] = {}

    # -- the sequence ------------------------------------------------------------------------
    def _member_views(self) -> list[ReplicaView]:
        if self._members is None:
            m = self._member
            assert m is not None
            self._members = [v for v, ok in zip(self._views, m, strict=True) if ok]
        return self._members

    def __len__(self) -> int:
        return len(self._member_views())

    @overload
    def __getitem__(self, i: int) -> ReplicaView: ...
    @overload
    def __getitem__(self, i: slice) -> list[ReplicaView]: ...
    def __getitem__(self, i):
        return self._member_views()[i]

    def __iter__(self) -> Iterator[ReplicaView]:
        return iter(self._member_views())

    # what ``Sequence`` mixes in, from the list of members
    def __contains__(self, value: object) -> bool:
        return value in self._member_views()

    def __reversed__(self) -> Iterator[ReplicaView]:
        return reversed(self._member_views())

    def index(self, value: Any, start: int = 0, stop: int | None = None) -> int:
        views = self._member_views()
        return views.index(value, start, len(views) if stop is None else stop)

    def count(self, value: Any) -> int:
        return self._member_views().count(value)

    # -- keeping it up to date ---------------------------------------------------------------
    def update(self, view: ReplicaView) -> None:
        """``view`` changed its load, its pending prefills or its availability."""
        self._update(self._pos[id(view)], view)

    def _update(self, i: int, view: ReplicaView) -> None:
        inside = self._member is None or self._member[i]
        if inside:
            self.total_in_flight += view.in_flight - self._in_flight[i]
        self._in_flight[i] = view.in_flight
        ok = inside and view.available
        if ok != self._ok[i]:
            self._ok[i] = ok
            self._available = None
            if inside:
                self._unavailable += -1 if ok else 1
        for c in self._companions.values():
            c.update(i, view, ok)
        if not ok:
            return
        bits = self._position_bits
        for by, heap in self._heaps.items():
            key = self._keys[by][i] = _key(by, view, i, bits)
            heappush(heap, key)
            if len(heap) > 2 * len(self._views) + _REBUILD_SLACK:
                self._heaps[by] = self._build(by)

    def _build(self, by: LoadKey) -> list[int]:
        """The heap of ``by``'s keys of the available views, and those keys noted as current."""
        views, ok, bits = self._views, self._ok, self._position_bits
        keys = self._keys[by] = [_key(by, v, i, bits) for i, v in enumerate(views)]
        heap = [k for k, good in zip(keys, ok, strict=True) if good]
        heapify(heap)
        return heap

    # -- subsets and companions --------------------------------------------------------------
    def subset(self, positions: Container[int]) -> LoadIndex:
        """A kept index of the views at ``positions`` (in this index's order), updated with
        this one: ``update`` on either is enough."""
        member = [i in positions for i in range(len(self._views))]
        child = LoadIndex(
            self._views, kept=self.kept, tracks_prefills=self.tracks_prefills, member=member
        )
        self._companions[("subset", id(child))] = _SubsetLink(child)
        return child

    def set_member(self, i: int, inside: bool) -> None:
        """Move the view at position ``i`` into this subset or out of it."""
        m = self._member
        assert m is not None, "set_member is for subsets"
        if m[i] == inside:
            return
        m[i] = inside
        view = self._views[i]
        self.total_in_flight += view.in_flight if inside else -view.in_flight
        if not view.available:
            self._unavailable += 1 if inside else -1
        # the unavailable count is settled above; ``_update`` changes it when a member's ``ok``
        # flips, so ``ok`` is set first (else an available view joining counted as one turning
        # available: the count fell below the truth and has_available() said yes with none)
        self._ok[i] = inside and view.available
        self._available = None
        self._members = None
        self._names = None
        self._update(i, view)

    def companion(self, key: Any, build: Callable[[LoadIndex], C]) -> C:
        """The object kept under ``key`` next to this index, built on first use; it is told
        every update. For kept indexes (a fresh one would build it for one request)."""
        c = self._companions.get(key)
        if c is None:
            c = self._companions[key] = build(self)
        return c  # type: ignore[return-value]

    # -- the answers -------------------------------------------------------------------------
    def available(self) -> Sequence[ReplicaView]:
        """The available views, in order (do not modify: it may be the index's own list)."""
        if self._member is None and not self._unavailable:
            return self._views
        if self._available is None:
            self._available = [v for v, ok in zip(self._views, self._ok, strict=True) if ok]
        return self._available

    def has_available(self) -> bool:
        return len(self) > self._unavailable

    def is_available(self, i: int) -> bool:
        """The view at position ``i`` is in this index and available."""
        return self._ok[i]

    def least(self, by: LoadKey = "requests") -> ReplicaView | None:
        """The available view with the fewest requests in flight (then the fewest tokens), or
        with ``by="tokens"`` the fewest tokens (then requests); ties: the first in order."""
        heap = self._heaps.get(by)
        if heap is None:
            heap = self._heaps[by] = self._build(by)
        keys, ok, mask = self._keys[by], self._ok, (1 << self._position_bits) - 1
        while heap:
            key = heap[0]
            i = key & mask
            if key == keys[i] and ok[i]:
                return self._views[i]
            heappop(heap)
        return None

    def position(self, view: ReplicaView) -> int:
        return self._pos[id(view)]

    @property
    def available_names(self) -> Container[str]:
        """The names of the available views (``name in idx.available_names``, O(1))."""
        return _AvailableNames(self)

    def named(self, name: str) -> ReplicaView | None:
        i = self._pos_by_name.get(name)
        if i is None or (self._member is not None and not self._member[i]):
            return None
        return self._views[i]

    @property
    def sorted_names(self) -> tuple[str, ...]:
        if self._names is None:
            self._names = tuple(sorted(v.name for v in self._member_views()))
        return self._names


class _SubsetLink:
    """Passes a parent's updates on to a subset."""

    __slots__ = ("child",)

    def __init__(self, child: LoadIndex) -> None:
        self.child = child

    def update(self, i: int, view: ReplicaView, in_index: bool) -> None:
        self.child._update(i, view)


Sequence.register(LoadIndex)
Container.register(_AvailableNames)


def load_index(replicas: ReplicaViews) -> LoadIndex:
    """The caller's index if it keeps one, else a fresh (not kept) index of these views."""
    return replicas if isinstance(replicas, LoadIndex) else LoadIndex(replicas, kept=False)


def bounded_load_cap(replicas: ReplicaViews, load_factor: float) -> int:
    """``ceil(c × (total in flight + 1) / n)``: the most a replica may hold before a sticky
    policy passes a request on (consistent hashing with bounded loads)."""
    idx = load_index(replicas)
    return math.ceil(load_factor * (idx.total_in_flight + 1) / max(1, len(idx)))
