"""The fast path's ``KVCacheManager``: ``engine.kv_cache_manager``'s rule, with each block table
kept on its request (``Request.block_table``), blocks no other request can see cached late or
not at all (``fastpath.private_output``), and a blocked queue head's watch
(``still_blocked``)."""

from __future__ import annotations

from servefleet.engine.kv_cache_manager import PrefixCacheStats
from servefleet.fastpath.block_pool import BlockPool, BlockTable
from servefleet.fastpath.request import ALL_BLOCKS, Request


class KVCacheManager:
    __slots__ = (
        "_evicting_hits_lets_in",
        "block_pool",
        "block_size",
        "enable_caching",
        "skips_blocked_heads",
        "stats",
    )

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_pool = BlockPool(num_blocks)
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.stats = PrefixCacheStats()
        self._evicting_hits_lets_in = False
        """Whether the request of ``note_blocked`` might get in if its hits were evicted."""
        self.skips_blocked_heads = True
        """Whether ``still_blocked`` may answer True (the shortcut); False: the plain rule,
        a blocked queue head tried again at every step (tests compare the two)."""

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
        max_blocks = min((req.num_tokens - 1) // bs, req.shareable_blocks)
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
        for what could change that (``still_blocked``), and for what a lookup finds
        (``hits_now``)."""
        hashes: list[int] = []
        if self.enable_caching:
            max_blocks = min((req.num_tokens - 1) // self.block_size, req.shareable_blocks)
            hashes = req.block_hashes[: min(len(hit_blocks) + 1, max_blocks)]
        # Evicting a hit lets it in only if the budget, not the prompt, limits its tokens.
        self._evicting_hits_lets_in = req.num_tokens > budget
        self.block_pool.watch(hashes, len(hit_blocks))

    def still_blocked(self) -> bool:
        """True if the request of ``note_blocked`` must still fail, given as much budget or
        more. Without a block freed or touched, none of its hashes cached since, its hits are
        a prefix of those it had (evictions take idle ones), so no more of them are in use
        while fewer blocks are free. Let ``T`` blocks hold the request, ``H`` be hit, ``U`` of
        them in use and ``F`` be free: with the whole request within the budget it needs
        ``T - H`` new blocks, and the idle hits come out of the free ones, so it fails while
        ``T > F + U``; within less budget, it needs as many as before while its hits stay."""
        pool = self.block_pool
        return (
            self.skips_blocked_heads
            and not pool.watch_fired
            and not (self._evicting_hits_lets_in and pool.watch_evicted)
        )

    def blocked_hits(self) -> int:
        """The tokens a lookup of the request of ``note_blocked`` finds now, while
        ``still_blocked``: its hit blocks up to the first evicted since (a lookup walks the
        chain of hashes from the first; no hash of the chain, nor the next, has been cached
        again since: ``watch_fired``)."""
        return self.block_pool.watch_kept * self.block_size

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
        (taken out of the free queue if idle) before fresh blocks are allocated.
        """
        bs = self.block_size
        table = req.block_table
        if table is None:
            table = req.block_table = BlockTable()
        pool = self.block_pool
        num_computed = req.num_computed_tokens + num_new_computed_tokens
        total = num_computed + num_new_tokens
        hits = new_computed_blocks or []
        num_hit = len(hits)
        num_new = -(-total // bs) - table.num_blocks - num_hit
        if num_new > 0 or num_hit:
            idle_hits = 0
            if num_hit:
                ref = pool.ref_cnt
                idle_hits = [ref[b] for b in hits].count(0)
            if num_new > pool.num_free_blocks - idle_hits:
                return False
            if num_hit:  # only at admission: the named blocks come first
                assert table.num_blocks == 0, "prefix hits after other blocks"
                pool.touch(hits)
                table.named.extend(hits)
            if num_new > 0:
                pool.allocate(num_new)
                table.blank += num_new
            req.num_slots = table.num_blocks * bs
        if self.enable_caching:
            num_full = min(min(total, req.num_tokens) // bs, req.shareable_blocks)
            if num_full > len(table.named):
                self._cache_full_blocks(req, table, num_full)
        return True

    def cache_computed(self, req: Request, num_computed: int) -> None:
        """Cache the full blocks of ``req``'s first ``num_computed`` tokens that are not yet
        (those a private request filled: ``fastpath.private_output``), up to its shareable ones."""
        num_full = min(num_computed // self.block_size, req.shareable_blocks)
        if self.enable_caching:
            table = req.block_table
            assert table is not None, "no blocks to cache"
            if num_full > len(table.named):
                self._cache_full_blocks(req, table, num_full)

    def _cache_full_blocks(self, req: Request, table: BlockTable, num_full: int) -> None:
        """Name the blank blocks up to ``num_full`` and cache them."""
        named = table.named
        start = len(named)
        hashes = req.ensure_block_hashes(num_full, self.block_size)
        named.extend(self.block_pool.name(num_full - start))
        table.blank -= num_full - start
        self.block_pool.cache_blocks(named, hashes, start, num_full)

    def free(self, req: Request, preempted: bool = False) -> None:
        """Release all blocks of ``req`` (its last block is evicted first), its full blocks
        cached (a private request's may not be yet); if it is ``preempted``, all of them, its
        own content's included, since its re-admission looks them up (``fastpath.private_output``)."""
        if preempted:
            req.shareable_blocks = ALL_BLOCKS
        table = req.block_table
        if (req.private_output or preempted) and table is not None:
            self.cache_computed(req, req.num_computed_tokens)
        req.block_table = None
        req.num_slots = 0
        if table is not None:
            self.block_pool.free_blocks(reversed(table.named), table.blank)

    def num_blocks_of(self, req: Request) -> int:
        table = req.block_table
        return 0 if table is None else table.num_blocks
