"""Predicted latency: route to the replica with the lowest predicted time to first token.

The prediction uses the engine cost model of each replica (its model, GPU and TP), the work the
replica already has, and the prefix-cache hit this prompt can expect there (from the same
chunk-hash index as prefix affinity). Cache affinity and load are traded in one unit, seconds,
instead of by hand-tuned thresholds: a replica that caches 90 % of the prompt wins unless its
queue costs more than the prefill it saves.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from servefleet.routing.base import (
    PENDING_PREFILLS,
    PREFIX_HASHES,
    ReplicaView,
    ReplicaViews,
    RequestContext,
    RoutingPolicy,
    Selection,
)
from servefleet.routing.load_index import LoadIndex, load_index
from servefleet.routing.prefix import DEFAULT_INDEX_CAPACITY, PREFIX_CHUNK_TOKENS, PrefixIndex
from servefleet.routing.ttft_search import TtftSearch

if TYPE_CHECKING:
    from servefleet.engine.cost_model import CostModel

FALLBACK_PREFILL_S_PER_TOKEN = 1e-4
"""ASSUMED, for replicas without a cost model: 10k prefill tokens/s."""
FALLBACK_DECODE_STEP_S = 0.02
"""ASSUMED, for replicas without a cost model: one decode step of a loaded batch."""

SEARCH_MIN_REPLICAS = 32
"""Below this many replicas a scan answers sooner than ``TtftSearch``, with the same answer
(``python benchmarks/routing_speed.py``; figures in benchmarks/RESULTS.md)."""


def cost_model_for(model: str, gpu: str, tp: int = 1, dtype: str = "auto") -> CostModel:
    """The engine cost model of ``model`` on ``tp`` × ``gpu`` (names as the catalogs have them)."""
    from servefleet.engine.cost_model import CostModel
    from servefleet.engine.memory import resolve_dtype
    from servefleet.hardware import get_gpu
    from servefleet.models import load_model

    spec, g = load_model(model), get_gpu(gpu)
    resolved, _ = resolve_dtype(spec, g, dtype)
    return CostModel(spec, g, tp, resolved)


def predict_ttft(r: ReplicaView, prompt_tokens: int, hit_tokens: int) -> float:
    """Seconds until a new request of ``prompt_tokens`` (``hit_tokens`` of them cached) gets
    its first token on ``r``: the prefill work queued ahead of it plus its own, chunked by
    the token budget left over by the running decodes, each chunk costing one mixed step;
    plus, when every sequence slot is taken, the decode steps until one frees up."""
    decodes = max(0, min(r.in_flight - r.pending_prefills, r.max_num_seqs))
    own = max(1, prompt_tokens - hit_tokens)
    work = r.pending_prefill_tokens + own
    cost = r.cost
    if cost is None:
        t = work * FALLBACK_PREFILL_S_PER_TOKEN + (1 if decodes else 0) * FALLBACK_DECODE_STEP_S
        excess = r.in_flight + 1 - r.max_num_seqs
        if excess > 0:
            t += excess * FALLBACK_DECODE_STEP_S
        return t * r.latency_scale
    budget = max(1, r.max_num_batched_tokens - decodes)
    steps = math.ceil(work / budget)
    chunk = min(work, budget)
    mean_ctx = r.in_flight_tokens // r.in_flight if r.in_flight else 0
    decode_ctx = decodes * (mean_ctx // 2)
    step = cost.step_time(
        decodes + chunk, decodes + 1, decodes, decode_ctx, [(chunk, hit_tokens)], decodes + 1
    )
    t = steps * step
    excess = r.in_flight + 1 - r.max_num_seqs
    if excess > 0:
        t += excess * cost.decode_step_time(r.max_num_seqs, max(1, mean_ctx // 2))
    return t * r.latency_scale


def ttft_lower_bound(
    r: ReplicaView, pending_tokens: int, decodes: int, half_ctx: int, prompt_tokens: int
) -> float:
    """A lower bound of ``predict_ttft(v, prompt_tokens, 0)`` over every view ``v`` with
    ``r``'s cost model, token budget, sequence cap and latency scale, at least
    ``pending_tokens`` waiting, ``decodes`` running decodes and ``half_ctx`` half mean context;
    nondecreasing in each of the three (``ttft_search``). It is ``predict_ttft`` with the
    prompt's chunk at its least, ``min(work, max_num_batched_tokens − max_num_seqs)``, and
    ``in_flight`` at its least, ``decodes``."""
    work = pending_tokens + max(1, prompt_tokens)
    d, s = decodes, r.max_num_seqs
    excess = max(0, d + 1 - s)
    cost = r.cost
    if cost is None:
        t = work * FALLBACK_PREFILL_S_PER_TOKEN + (FALLBACK_DECODE_STEP_S if d else 0.0)
        return (t + excess * FALLBACK_DECODE_STEP_S) * r.latency_scale
    budget = max(1, r.max_num_batched_tokens - d)
    chunk = min(work, budget)
    least_chunk = min(work, max(1, r.max_num_batched_tokens - s))
    step = cost.step_time(d + chunk, d + 1, d, d * half_ctx, [(least_chunk, 0)], d + 1)
    t = math.ceil(work / budget) * step
    if excess:
        t += excess * cost.decode_step_time(s, max(1, half_ctx))
    return t * r.latency_scale


class PredictedLatency(RoutingPolicy):
    """Rule: the available replica with the lowest predicted TTFT (``predict_ttft``), given its
    queued and running work, the prefix hit this prompt can expect there, and its GPU's cost
    model; ties go to the fewest in flight."""

    name = "predicted-latency"
    needs = frozenset({PREFIX_HASHES, PENDING_PREFILLS})

    def __init__(
        self,
        index_capacity: int = DEFAULT_INDEX_CAPACITY,
        chunk_tokens: int = PREFIX_CHUNK_TOKENS,
    ) -> None:
        self.index = PrefixIndex(index_capacity)
        self.chunk_tokens = chunk_tokens

    def select(self, replicas: ReplicaViews, ctx: RequestContext) -> Selection | None:
        idx = load_index(replicas)
        if not idx.has_available():
            return None
        depth = (
            self.index.match(ctx.prefix_hashes, idx.available_names) if ctx.prefix_hashes else {}
        )
        if idx.tracks_prefills and len(idx) > SEARCH_MIN_REPLICAS:
            return self._search(idx, ctx, depth)
        best, best_key, best_hit = None, None, 0
        for r in idx.available():
            hit = self._hit(depth.get(r.name, 0), ctx)
            t = predict_ttft(r, ctx.prompt_tokens, hit)
            key = (t, r.in_flight, r.in_flight_tokens)
            if best_key is None or key < best_key:
                best, best_key, best_hit = r, key, hit
        assert best is not None and best_key is not None
        return Selection(best, "affinity" if best_hit else "load", best_hit, best_key[0])

    def _hit(self, chunks: int, ctx: RequestContext) -> int:
        return min(chunks * self.chunk_tokens, max(0, ctx.prompt_tokens - 1))

    def _search(self, idx: LoadIndex, ctx: RequestContext, depth: dict[str, int]) -> Selection:
        """The scan's answer from a kept index: the replicas with a cached prefix predicted
        one by one, the rest found by ``TtftSearch`` (the same keys, so the same choice)."""
        p = ctx.prompt_tokens
        best, best_view, best_hit = None, None, 0
        matched = set()
        for name, chunks in depth.items():
            r = idx.named(name)
            assert r is not None
            i = idx.position(r)
            matched.add(i)
            hit = self._hit(chunks, ctx)
            key = (predict_ttft(r, p, hit), r.in_flight, r.in_flight_tokens, i)
            if best is None or key < best:
                best, best_view, best_hit = key, r, hit
        key, view = idx.companion(TtftSearch, TtftSearch).best(
            lambda r: predict_ttft(r, p, 0),
            lambda r, w, d, h: ttft_lower_bound(r, w, d, h, p),
            best,
            matched,
        )
        if view is not None:
            best, best_view, best_hit = key, view, 0
        assert best is not None and best_view is not None
        return Selection(best_view, "affinity" if best_hit else "load", best_hit, best[0])

    def on_routed(self, replica: ReplicaView, ctx: RequestContext) -> None:
        if ctx.prefix_hashes:
            self.index.record(replica.name, ctx.prefix_hashes)

    def forget(self, name: str) -> None:
        self.index.forget(name)
