"""Per-request block tables over a BlockPool (vLLM V1's ``KVCacheManager``)."""

from __future__ import annotations

from dataclasses import dataclass

from servefleet.engine.block_pool import BlockPool
from servefleet.engine.request import Request


@dataclass(slots=True)
class PrefixCacheStats:
    """vLLM's counters: tokens queried and found, once per admission (a request retried at the
    head of the queue is counted when it gets in); re-admissions after a preemption apart."""

    queries: int = 0
    hits: int = 0
    requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0
    preempted_requests: int = 0

    def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hits


class KVCacheManager:
    __slots__ = (
        "block_pool",
        "block_size",
        "enable_caching",
        "num_cached_blocks",
        "req_blocks",
        "stats",
    )

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_pool = BlockPool(num_blocks)
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.req_blocks: dict[str, list[int]] = {}
        self.num_cached_blocks: dict[str, int] = {}
        """How many leading blocks of a request are hashed into the cache."""
        self.stats = PrefixCacheStats()

    @property
    def usage(self) -> float:
        return self.block_pool.usage

    def get_computed_blocks(self, req: Request) -> tuple[list[int], int]:
        """The longest run of cached full blocks that prefixes ``req``, and its token count.

        At least one token is always left to compute (the last prompt token's logits are
        needed), so a fully cached prompt hits one block less. Statistics are recorded by
        ``record_prefix_stats`` once the request is admitted.
        """
        if not self.enable_caching:
            return [], 0
        bs = self.block_size
        max_blocks = (req.num_tokens - 1) // bs
        hashes = req.block_hashes
        if len(hashes) < max_blocks:
            req.ensure_block_hashes(max_blocks, bs)
        blocks: list[int] = []
        cached = self.block_pool.cached
        for i in range(max_blocks):
            b = cached.get(hashes[i])
            if b is None:
                break
            blocks.append(b)
        return blocks, len(blocks) * bs

    def note_blocked(self, req: Request, hit_blocks: list[int], budget: int) -> None:
        """``req`` could not be admitted with these prefix hits and ``budget`` tokens: watch
        for what could change that (``still_blocked``)."""
        hashes: list[int] = []
        if self.enable_caching:
            max_blocks = (req.num_tokens - 1) // self.block_size
            hashes = req.block_hashes[: min(len(hit_blocks) + 1, max_blocks)]
        # Evicting a hit lets it in only if the budget, not the prompt, limits its tokens.
        self.block_pool.watch(hit_blocks if req.num_tokens > budget else (), hashes)

    def still_blocked(self) -> bool:
        """True if the request of ``note_blocked`` must still fail, given as much budget or
        more. Without a block freed or touched, none of its hashes cached since, its hits are
        a prefix of those it had (evictions take idle ones), so no more of them are in use
        while fewer blocks are free. Let ``T`` blocks hold the request, ``H`` be hit, ``U`` of
        them in use and ``F`` be free: with the whole request within the budget it needs
        ``T - H`` new blocks, and the idle hits come out of the free ones, so it fails while
        ``T > F + U``; within less budget, it needs as many as before while its hits stay."""
        return not self.block_pool.watch_fired

    def record_prefix_stats(self, req: Request, num_hit: int) -> None:
        if self.enable_caching:
            self.stats.record(req.num_tokens, num_hit, req.num_preemptions > 0)

    def allocate_slots(
        self,
        req: Request,
        num_new_tokens: int,
        new_computed_blocks: list[int] | None = None,
        num_new_computed_tokens: int = 0,
    ) -> bool:
        """Make room for ``num_new_tokens`` more tokens of ``req``; False if blocks run out.

        ``new_computed_blocks`` are prefix-cache hits found at admission: they are referenced
        (taken out of the free queue if idle) before fresh blocks are allocated.
        """
        bs = self.block_size
        blocks = self.req_blocks.get(req.request_id)
        if blocks is None:
            blocks = self.req_blocks[req.request_id] = []
            self.num_cached_blocks[req.request_id] = 0
        pool = self.block_pool
        num_computed = req.num_computed_tokens + num_new_computed_tokens
        total = num_computed + num_new_tokens
        num_hit = len(new_computed_blocks) if new_computed_blocks else 0
        num_new = -(-total // bs) - len(blocks) - num_hit
        if num_new > 0 or num_hit:
            idle_hits = 0
            if num_hit:
                ref = pool.ref_cnt
                idle_hits = [ref[b] for b in new_computed_blocks].count(0)
            if num_new > pool.num_free_blocks - idle_hits:
                return False
            if num_hit:
                pool.touch(new_computed_blocks)
                blocks.extend(new_computed_blocks)
                self.num_cached_blocks[req.request_id] = len(blocks)
            if num_new > 0:
                blocks.extend(pool.allocate(num_new))
            req.num_slots = len(blocks) * bs
        if self.enable_caching:
            num_full = min(total, req.num_tokens) // bs
            if num_full > self.num_cached_blocks[req.request_id]:
                self._cache_full_blocks(req, blocks, num_full)
        return True

    def grow_decode(self, req: Request, total: int) -> None:
        """``allocate_slots(req, 1)`` for a decode whose new token is the ``total``-th (for a
        request whose counters are not up to date): a block for it if its blocks are full,
        and the block it fills cached. The caller has checked that a block is free."""
        bs = self.block_size
        blocks = self.req_blocks[req.request_id]
        if total > req.num_slots:
            blocks.extend(self.block_pool.allocate(1))
            req.num_slots = len(blocks) * bs
        if self.enable_caching and total // bs > self.num_cached_blocks[req.request_id]:
            self._cache_full_blocks(req, blocks, total // bs)

    def _cache_full_blocks(self, req: Request, blocks: list[int], num_full: int) -> None:
        start = self.num_cached_blocks[req.request_id]
        hashes = req.ensure_block_hashes(num_full, self.block_size)
        self.block_pool.cache_blocks(blocks, hashes, start, num_full)
        self.num_cached_blocks[req.request_id] = num_full

    def free(self, req: Request) -> None:
        """Release all blocks of ``req`` (its last block is evicted first)."""
        blocks = self.req_blocks.pop(req.request_id, None)
        self.num_cached_blocks.pop(req.request_id, None)
        req.num_slots = 0
        if blocks:
            self.block_pool.free_blocks(reversed(blocks))

    def num_blocks_of(self, req: Request) -> int:
        return len(self.req_blocks.get(req.request_id, ()))
