"""The replica with the lowest predicted TTFT, found without predicting every replica.

``predict_ttft`` depends on the request's own prompt through the cost model (steps, chunk
size, the step's shape), so no single key orders the replicas for every request. It does
depend on a replica only through its *state* — ``(W, D, hc, in_flight)``: prompt tokens
waiting for prefill, running decodes, half the mean context, requests in flight — and its
*kind* (cost model, token budget, sequence cap, latency scale). For a request of ``P`` tokens
with no cached prefix, a lower bound ``g(W, D, hc)`` of its TTFT (below) is nondecreasing in
each of the three, so the threshold algorithm (Fagin, Lotem, Naor 2001) finds the exact
minimum: walk three sorted lists of the states (by W, by D, by hc) side by side, predict each
state met (exactly, with ``predict_ttft``), and stop when ``g`` of the values just read — a
bound for every state not yet met — exceeds the best prediction. Replicas with equal states
share one entry (their predictions are equal; the first in order wins), so an idle fleet is
one state, not n.

The bound (``predicted.ttft_lower_bound``): the exact prediction with the prompt's chunk
replaced by ``min(W + P, B − S)`` (the smallest chunk any decode count allows) and
``in_flight`` by ``D`` (``D ≤ in_flight``); ``predict_ttft`` is otherwise a nondecreasing
function of W, D and hc when the cost model's step time is nondecreasing in each of its
arguments (``tests/test_ttft_search.py`` checks both that and the answers against the scan).
In the usual regime (``W + P ≤ B − S``) the bound is exact, so the walk stops after the first
few states.

Replicas with a cached prefix are predicted by the caller (at most a few: the prefix index
remembers four replicas per chunk) and passed as ``exclude``.
"""

from __future__ import annotations

from collections.abc import Callable, Container

from sortedcontainers import SortedList

from servefleet.routing.base import ReplicaView
from servefleet.routing.load_index import LoadIndex

State = tuple[int, int, int, int]
"""(pending prefill tokens, pending prefills, in flight, in-flight tokens)."""
Key = tuple[float, int, int, int]
"""(predicted TTFT, in flight, in-flight tokens, position): the scan's order."""


class _Kind:
    __slots__ = ("by_d", "by_h", "by_w", "members", "view")

    def __init__(self, v: ReplicaView) -> None:
        self.view = v
        """A replica of this kind (the bound reads only what the kind fixes)."""
        self.members: dict[State, list[int]] = {}
        self.by_w: SortedList = SortedList()
        self.by_d: SortedList = SortedList()
        self.by_h: SortedList = SortedList()

    def _attrs(self, s: State) -> tuple[int, int, int]:
        w, pending, inf, tok = s
        d = max(0, min(inf - pending, self.view.max_num_seqs))
        return w, d, (tok // inf) // 2 if inf else 0

    def add(self, s: State, i: int) -> None:
        pos = self.members.get(s)
        if pos is None:
            self.members[s] = [i]
            w, d, h = self._attrs(s)
            self.by_w.add((w, s))
            self.by_d.add((d, s))
            self.by_h.add((h, s))
        else:
            pos.append(i)
            pos.sort()

    def remove(self, s: State, i: int) -> None:
        pos = self.members[s]
        pos.remove(i)
        if not pos:
            del self.members[s]
            w, d, h = self._attrs(s)
            self.by_w.remove((w, s))
            self.by_d.remove((d, s))
            self.by_h.remove((h, s))


class TtftSearch:
    """A kept index's available replicas grouped by kind and state (module docstring); a
    ``LoadIndex`` companion, told every update."""

    __slots__ = ("_kinds", "_views", "_where")

    def __init__(self, idx: LoadIndex) -> None:
        self._views: dict[int, ReplicaView] = {}
        self._where: dict[int, tuple[tuple, State]] = {}
        self._kinds: dict[tuple, _Kind] = {}
        for v in idx:
            i = idx.position(v)
            self.update(i, v, idx.is_available(i))

    def update(self, i: int, view: ReplicaView, in_index: bool) -> None:
        old = self._where.get(i)
        new = None
        if in_index:
            kind = (
                id(view.cost),
                view.max_num_batched_tokens,
                view.max_num_seqs,
                view.latency_scale,
            )
            state = (
                view.pending_prefill_tokens,
                view.pending_prefills,
                view.in_flight,
                view.in_flight_tokens,
            )
            new = (kind, state)
        if old == new:
            return
        if old is not None:
            self._kinds[old[0]].remove(old[1], i)
            del self._where[i]
        if new is not None:
            k = self._kinds.get(new[0])
            if k is None:
                k = self._kinds[new[0]] = _Kind(view)
            k.add(new[1], i)
            self._where[i] = new
            self._views[i] = view

    def best(
        self,
        predict: Callable[[ReplicaView], float],
        bound: Callable[[ReplicaView, int, int, int], float],
        best: Key | None,
        exclude: Container[int],
    ) -> tuple[Key, ReplicaView] | tuple[None, None]:
        """The lowest key among the replicas not in ``exclude`` (positions) if it is below
        ``best``: ``predict(view)`` is the exact prediction for this request with no cached
        prefix, ``bound(view, W, D, hc)`` its lower bound over the states of ``view``'s kind
        with at least these W, D, hc."""
        found: ReplicaView | None = None
        for kind in self._kinds.values():
            lists = (kind.by_w, kind.by_d, kind.by_h)
            walks = [iter(sl) for sl in lists]
            level = [0, 0, 0]
            seen: set[State] = set()
            done = False
            while not done:
                for j, walk in enumerate(walks):
                    item = next(walk, None)
                    if item is None:  # every state met
                        done = True
                        break
                    level[j], s = item
                    if s in seen:
                        continue
                    seen.add(s)
                    i = next((p for p in kind.members[s] if p not in exclude), None)
                    if i is None:
                        continue
                    v = self._views[i]
                    key = (predict(v), s[2], s[3], i)
                    if best is None or key < best:
                        best, found = key, v
                else:
                    if best is not None and bound(kind.view, *level) > best[0]:
                        done = True
        return (best, found) if found is not None else (None, None)
