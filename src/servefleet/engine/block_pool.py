"""Paged KV blocks with prefix caching (vLLM V1's ``BlockPool``).

A block is free when no request references it. Free blocks wait in an LRU queue (``free``): a
block freed last is evicted last, and a free block that still holds a cached (hashed) full
block can be reused by a later request with the same prefix (a *prefix hit* takes it out of
the queue) until it is evicted: taken from the queue's head for fresh use, its hash forgotten.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.ref_cnt = [0] * num_blocks
        """Requests referencing each block."""
        self.block_hash: list[int | None] = [None] * num_blocks
        """The hash of the full block each block holds, if it is cached."""
        self.cached: dict[int, int] = {}
        """Hash of a full block -> the block holding it (one block per hash)."""
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        """The free blocks, least recently freed first (the eviction order)."""

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    @property
    def free_queue(self) -> list[int]:
        return list(self.free)

    @property
    def usage(self) -> float:
        """Fraction of blocks referenced by requests (vLLM's ``kv_cache_usage_perc``)."""
        return 1.0 - len(self.free) / self.num_blocks

    def touch(self, blocks: Iterable[int]) -> None:
        """Take a reference on cached blocks found by a prefix hit."""
        for b in blocks:
            if self.ref_cnt[b] == 0:
                del self.free[b]
            self.ref_cnt[b] += 1

    def allocate(self, n: int) -> list[int]:
        """``n`` fresh blocks from the head of the free queue, evicting what they cached."""
        if n > len(self.free):
            raise RuntimeError(f"allocate({n}) with only {len(self.free)} free blocks")
        out = []
        for _ in range(n):
            b, _ = self.free.popitem(last=False)
            h = self.block_hash[b]
            if h is not None:
                if self.cached.get(h) == b:
                    del self.cached[h]
                self.block_hash[b] = None
            self.ref_cnt[b] = 1
            out.append(b)
        return out

    def free_blocks(self, blocks: Iterable[int]) -> None:
        """Drop one reference from each block; blocks reaching zero join the queue's tail in
        the order given (callers pass a request's blocks last first, so its tail is evicted
        first)."""
        for b in blocks:
            if self.ref_cnt[b] <= 0:
                raise RuntimeError(f"block {b} freed more often than referenced")
            self.ref_cnt[b] -= 1
            if self.ref_cnt[b] == 0:
                self.free[b] = None

    def cache_block(self, block: int, block_hash: int) -> None:
        """Record that ``block`` holds the full block ``block_hash`` (first holder wins)."""
        if self.block_hash[block] is None and block_hash not in self.cached:
            self.cached[block_hash] = block
            self.block_hash[block] = block_hash
