"""Per-request block tables over a ``BlockPool``, and prefix-cache lookups (vLLM V1's
``KVCacheManager``)."""

from __future__ import annotations

from dataclasses import dataclass

from servefleet.engine.block_pool import BlockPool
from servefleet.engine.request import Request


@dataclass(slots=True)
class PrefixCacheStats:
    """The prefix cache's counters, two ways.

    ``queries``/``hits``/``requests`` are vLLM 0.26's ``PrefixCacheStats`` (exported as
    ``vllm:prefix_cache_queries`` / ``_hits``): tokens looked up and found at every lookup of
    a waiting request — vLLM's ``get_computed_blocks``, run each time the scheduler tries the
    request, so a queue head blocked for lack of blocks is counted again at every retry; a
    re-admission after a preemption is counted apart (``preempted_*``, not exported).

    ``prompt_tokens``/``cached_tokens`` count each request once, at its first admission: its
    prompt and the tokens the prefix cache served (what vLLM's ``vllm:prompt_tokens`` and
    ``vllm:prompt_tokens_cached`` count, and the request's ``cached_tokens``). Their ratio is
    the prefix-hit rate the requests saw; ``hits / queries`` reads lower whenever requests
    queue. All stay 0 without prefix caching.
    """

    queries: int = 0
    hits: int = 0
    requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0
    preempted_requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0

    def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
        """One lookup of a request of ``num_tokens`` tokens that found ``num_hits``."""
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hits

    def admit(self, num_prompt_tokens: int, num_hits: int) -> None:
        """A request admitted for the first time, ``num_hits`` of its prompt found cached."""
        self.prompt_tokens += num_prompt_tokens
        self.cached_tokens += num_hits


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_pool = BlockPool(num_blocks)
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.stats = PrefixCacheStats()
        self.blocks: dict[str, list[int]] = {}
        """Request id -> its blocks, in order."""
        self.num_cached_blocks: dict[str, int] = {}
        """Request id -> how many of its first blocks are cached (or were offered to the
        cache: a block whose hash another block holds already stays uncached)."""

    @property
    def usage(self) -> float:
        return self.block_pool.usage

    def get_computed_blocks(self, req: Request) -> tuple[list[int], int]:
        """The longest run of cached full blocks that prefixes ``req``, and its token count.

        At least one token is always left to compute (the last prompt token's logits are
        needed), so a fully cached prompt hits one block less. The scheduler counts the lookup
        (``record_lookup``).
        """
        if not self.enable_caching:
            return [], 0
        bs = self.block_size
        hashes = req.ensure_block_hashes((req.num_tokens - 1) // bs, bs)
        blocks: list[int] = []
        for h in hashes[: (req.num_tokens - 1) // bs]:
            b = self.block_pool.cached.get(h)
            if b is None:
                break
            blocks.append(b)
        return blocks, len(blocks) * bs

    def record_admission(self, req: Request, num_hit: int) -> None:
        """Count ``req``'s first admission, ``num_hit`` tokens of its prompt found cached (with
        prefix caching on)."""
        if self.enable_caching:
            self.stats.admit(req.num_prompt_tokens, num_hit)

    def record_lookup(self, req: Request, num_hit: int) -> None:
        """Count a lookup of ``req`` that found ``num_hit`` tokens (where vLLM counts: at every
        scheduling attempt, admitted or not); nothing without prefix caching, as in vLLM."""
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
        (taken out of the free queue if idle) before fresh blocks are allocated. Every block
        whose tokens are all computed after this step is cached.
        """
        bs, pool = self.block_size, self.block_pool
        blocks = self.blocks.get(req.request_id, [])
        hits = new_computed_blocks or []
        total = req.num_computed_tokens + num_new_computed_tokens + num_new_tokens
        num_new = -(-total // bs) - len(blocks) - len(hits)
        idle_hits = sum(1 for b in hits if pool.ref_cnt[b] == 0)
        if num_new > pool.num_free_blocks - idle_hits:
            return False
        if hits:
            pool.touch(hits)
            blocks.extend(hits)
            self.num_cached_blocks[req.request_id] = len(hits)
        if num_new > 0:
            blocks.extend(pool.allocate(num_new))
        self.blocks[req.request_id] = blocks
        if self.enable_caching:
            num_full = min(total, req.num_tokens) // bs
            start = self.num_cached_blocks.get(req.request_id, 0)
            if num_full > start:
                hashes = req.ensure_block_hashes(num_full, bs)
                for i in range(start, num_full):
                    pool.cache_block(blocks[i], hashes[i])
                self.num_cached_blocks[req.request_id] = num_full
        return True

    def free(self, req: Request) -> None:
        """Release all blocks of ``req`` (its last block is evicted first)."""
        blocks = self.blocks.pop(req.request_id, [])
        self.num_cached_blocks.pop(req.request_id, None)
        self.block_pool.free_blocks(reversed(blocks))

    def num_blocks_of(self, req: Request) -> int:
        return len(self.blocks.get(req.request_id, ()))
