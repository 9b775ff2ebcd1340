"""Predicted latency: route to the replica with the lowest predicted time to first token.

The prediction uses the engine cost model of each replica (its model, GPU and TP), the work the
replica already has, and the prefix-cache hit this prompt can expect there (from the same
chunk-hash index as prefix affinity). Cache affinity and load are traded in one unit, seconds,
instead of by hand-tuned thresholds: a replica that caches 90 % of the prompt wins unless its
queue costs more than the prefill it saves.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from servefleet.routing.base import (
    PREFIX_HASHES,
    ReplicaView,
    RequestContext,
    RoutingPolicy,
    Selection,
)
from servefleet.routing.load_index import load_index
from servefleet.routing.prefix import DEFAULT_INDEX_CAPACITY, PREFIX_CHUNK_TOKENS, PrefixIndex

if TYPE_CHECKING:
    from servefleet.engine.cost_model import CostModel

FALLBACK_PREFILL_S_PER_TOKEN = 1e-4
"""ASSUMED, for replicas without a cost model: 10k prefill tokens/s."""
FALLBACK_DECODE_STEP_S = 0.02
"""ASSUMED, for replicas without a cost model: one decode step of a loaded batch."""


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


class PredictedLatency(RoutingPolicy):
    """Rule: the available replica with the lowest predicted TTFT (``predict_ttft``), given its
    queued and running work, the prefix hit this prompt can expect there, and its GPU's cost
    model; ties go to the fewest in flight."""

    name = "predicted-latency"
    needs = frozenset({PREFIX_HASHES})

    def __init__(
        self,
        index_capacity: int = DEFAULT_INDEX_CAPACITY,
        chunk_tokens: int = PREFIX_CHUNK_TOKENS,
    ) -> None:
        self.index = PrefixIndex(index_capacity)
        self.chunk_tokens = chunk_tokens

    def select(self, replicas: Sequence[ReplicaView], ctx: RequestContext) -> Selection | None:
        idx = load_index(replicas)
        cands = idx.available()
        if not cands:
            return None
        depth = (
            self.index.match(ctx.prefix_hashes, idx.available_names) if ctx.prefix_hashes else {}
        )
        best, best_key, best_hit = None, None, 0
        for r in cands:
            hit = min(depth.get(r.name, 0) * self.chunk_tokens, max(0, ctx.prompt_tokens - 1))
            t = predict_ttft(r, ctx.prompt_tokens, hit)
            key = (t, r.in_flight, r.in_flight_tokens)
            if best_key is None or key < best_key:
                best, best_key, best_hit = r, key, hit
        assert best is not None and best_key is not None
        return Selection(best, "affinity" if best_hit else "load", best_hit, best_key[0])

    def on_routed(self, replica: ReplicaView, ctx: RequestContext) -> None:
        if ctx.prefix_hashes:
            self.index.record(replica.name, ctx.prefix_hashes)

    def forget(self, name: str) -> None:
        self.index.forget(name)
