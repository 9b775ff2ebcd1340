"""Prefix affinity: send a prompt where its longest prefix was served recently.

A prompt is cut into fixed-size chunks and each chunk is hashed together with the hash before
it (a chain, as vLLM hashes KV blocks), so equal hashes at position i mean equal prompts up to
the end of chunk i. Both worlds cut the same way, in their own units:

* the gateway hashes the *rendered* prompt text (every chat message, role included) in chunks
  of ``PREFIX_CHUNK_CHARS`` characters (``text_prefix_hashes``), or token-id prompts in chunks
  of ``PREFIX_CHUNK_TOKENS`` ids;
* the simulator hashes the prompt's segments in chunks of ``PREFIX_CHUNK_TOKENS`` tokens
  (``segment_prefix_hashes``).

Only full chunks are hashed, and at most ``MAX_PREFIX_CHUNKS`` of them (the first ones), which
bounds the work per request.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Container, Iterable, Sequence

from servefleet.routing.base import (
    PREFIX_HASHES,
    ReplicaView,
    ReplicaViews,
    RequestContext,
    RoutingPolicy,
    Selection,
)
from servefleet.routing.load_index import bounded_load_cap, load_index
from servefleet.routing.simple import LeastOutstanding
from servefleet.tokens import SegmentContent

PREFIX_CHUNK_TOKENS = 64
CHARS_PER_TOKEN = 4
"""The gateway's estimate (English text under a BPE tokenizer)."""
PREFIX_CHUNK_CHARS = PREFIX_CHUNK_TOKENS * CHARS_PER_TOKEN
MAX_PREFIX_CHUNKS = 128
DEFAULT_INDEX_CAPACITY = 200_000
"""Chunk hashes remembered (LRU); ~100 bytes each."""
REPLICAS_PER_CHUNK = 4
"""Replicas remembered per chunk (the most recent)."""


def chain_hashes(pieces: Iterable[bytes]) -> tuple[int, ...]:
    """64-bit chained hashes: ``h_i = H(h_{i-1} ‖ piece_i)``."""
    out = []
    prev = b""
    for piece in pieces:
        d = hashlib.blake2b(prev + piece, digest_size=8).digest()
        out.append(int.from_bytes(d, "big"))
        prev = d
    return tuple(out)


def text_prefix_hashes(text: str, chunk_chars: int = PREFIX_CHUNK_CHARS) -> tuple[int, ...]:
    """Chained hashes of the full ``chunk_chars``-character chunks of ``text``."""
    n = min(len(text) // chunk_chars, MAX_PREFIX_CHUNKS)
    data = text[: n * chunk_chars].encode("utf-8", "surrogatepass")
    if len(data) == n * chunk_chars:  # ASCII: byte offsets are character offsets
        return chain_hashes(data[i * chunk_chars : (i + 1) * chunk_chars] for i in range(n))
    return chain_hashes(
        text[i * chunk_chars : (i + 1) * chunk_chars].encode("utf-8", "surrogatepass")
        for i in range(n)
    )


def ids_prefix_hashes(ids: Sequence[int], chunk: int = PREFIX_CHUNK_TOKENS) -> tuple[int, ...]:
    """Chained hashes of full chunks of a token-id prompt."""
    n = min(len(ids) // chunk, MAX_PREFIX_CHUNKS)
    return chain_hashes(
        ",".join(map(str, ids[i * chunk : (i + 1) * chunk])).encode() for i in range(n)
    )


def segment_prefix_hashes(segments, request_id: str, chunk: int = PREFIX_CHUNK_TOKENS):
    """Chained hashes of full chunks of a simulated prompt (segments of keyed tokens)."""
    content = SegmentContent(segments, request_id)
    total = sum(s.length for s in segments)
    n = min(total // chunk, MAX_PREFIX_CHUNKS)
    return chain_hashes(
        repr(content.block_content(i * chunk, (i + 1) * chunk)).encode() for i in range(n)
    )


class PrefixIndex:
    """An LRU-bounded map from chunk hash to the replicas that recently served it."""

    def __init__(self, capacity: int = DEFAULT_INDEX_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"prefix index capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._idx: OrderedDict[int, OrderedDict[str, None]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._idx)

    def record(self, replica: str, hashes: Sequence[int]) -> None:
        """``replica`` now holds these chunks. The deepest chunk is touched first, so the LRU
        evicts deep chunks before the shallow ones a chain starts with."""
        idx = self._idx
        for h in reversed(hashes):
            entry = idx.pop(h, None)
            if entry is None:
                entry = OrderedDict()
            else:
                entry.pop(replica, None)
            entry[replica] = None
            while len(entry) > REPLICAS_PER_CHUNK:
                entry.popitem(last=False)
            idx[h] = entry
        while len(idx) > self.capacity:
            idx.popitem(last=False)

    def forget(self, replica: str) -> None:
        """Drop a removed replica (lazily: entries that become empty go)."""
        for h in [h for h, e in self._idx.items() if replica in e]:
            e = self._idx[h]
            e.pop(replica, None)
            if not e:
                del self._idx[h]

    def match(self, hashes: Sequence[int], names: Container[str]) -> dict[str, int]:
        """For each of ``names`` that matches at least one chunk: how many leading chunks
        (the work is per chunk and per replica remembered for it, not per name)."""
        alive: list[str] | None = None
        depth: dict[str, int] = {}
        idx = self._idx
        for i, h in enumerate(hashes):
            entry = idx.get(h)
            if entry is None:
                break
            if alive is None:
                alive = [n for n in entry if n in names]
            else:
                alive = [n for n in alive if n in entry]
            if not alive:
                break
            for n in alive:
                depth[n] = i + 1
        return depth


class PrefixAffinity(RoutingPolicy):
    """Rule: the available replica whose recently served prompts share the longest chunk
    prefix with this one, unless its load is above ``ceil(c × (total + 1) / n)`` (then the
    next-longest match within the bound); no match within the bound: least outstanding."""

    name = "prefix-affinity"
    needs = frozenset({PREFIX_HASHES})

    def __init__(
        self,
        load_factor: float = 1.25,
        min_match_chunks: int = 1,
        index_capacity: int = DEFAULT_INDEX_CAPACITY,
        chunk_tokens: int = PREFIX_CHUNK_TOKENS,
    ) -> None:
        if load_factor < 1.0:
            raise ValueError(f"load_factor must be >= 1.0, got {load_factor}")
        self.load_factor = load_factor
        self.min_match_chunks = max(1, min_match_chunks)
        self.chunk_tokens = chunk_tokens
        self.index = PrefixIndex(index_capacity)
        self._fallback = LeastOutstanding()

    def select(self, replicas: ReplicaViews, ctx: RequestContext) -> Selection | None:
        idx = load_index(replicas)
        if not idx.has_available():
            return None
        depth = (
            self.index.match(ctx.prefix_hashes, idx.available_names) if ctx.prefix_hashes else {}
        )
        decision = "miss"
        if depth:
            cap = bounded_load_cap(idx, self.load_factor)
            matched = [idx.named(n) for n, d in depth.items() if d >= self.min_match_chunks]
            ranked = sorted(
                matched,
                key=lambda r: (-depth[r.name], r.in_flight, r.in_flight_tokens, idx.position(r)),
            )
            for r in ranked:
                if r.in_flight + 1 <= cap:
                    hit = min(depth[r.name] * self.chunk_tokens, ctx.prompt_tokens)
                    return Selection(r, "affinity", hit)
            decision = "overloaded"
        fallback = self._fallback.select(idx, ctx)
        assert fallback is not None
        return Selection(fallback.replica, decision)

    def on_routed(self, replica: ReplicaView, ctx: RequestContext) -> None:
        if ctx.prefix_hashes:
            self.index.record(replica.name, ctx.prefix_hashes)

    def forget(self, name: str) -> None:
        self.index.forget(name)
