"""Paged KV blocks with prefix caching (vLLM V1's ``BlockPool``).

A block is free when no request references it. Free blocks wait in an LRU queue: a block
freed last is evicted last, and a free block that still holds a cached (hashed) full block can
be reused by a later request with the same prefix until it is evicted.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator
from itertools import islice, repeat

MANY_BLOCKS = 8
"""From this many blocks on, ``allocate`` and ``free_blocks`` work on the whole run at once
(loops in the interpreter's C code: faster for a prompt's blocks, slower for one)."""


def _run(calls: Iterator) -> None:
    """Make every call of a ``map`` (the loop runs in C)."""
    deque(calls, maxlen=0)


class BlockPool:
    __slots__ = (
        "block_hash",
        "cached",
        "free_queue",
        "num_blocks",
        "ref_cnt",
        "watch_fired",
        "watched_blocks",
        "watched_hashes",
    )

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.ref_cnt = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}
        """Hash of a full block -> the block holding it."""
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        """Free blocks, least recently freed first (the eviction order)."""
        self.watched_blocks: frozenset[int] = frozenset()
        self.watched_hashes: frozenset[int] = frozenset()
        self.watch_fired = True
        """False while none of these has happened since ``watch``: a block freed or touched,
        a watched block evicted, a watched hash cached, the cache reset."""

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        """Fraction of blocks referenced by requests (vLLM's ``kv_cache_usage_perc``)."""
        return 1.0 - len(self.free_queue) / self.num_blocks

    def get_cached_block(self, block_hash: int) -> int | None:
        return self.cached.get(block_hash)

    def watch(self, blocks: Iterable[int], hashes: Iterable[int]) -> None:
        """Start watching (``watch_fired``) for the eviction of ``blocks``, the caching of
        ``hashes``, and for any block freed or touched."""
        self.watched_blocks = frozenset(blocks)
        self.watched_hashes = frozenset(hashes)
        self.watch_fired = False

    def touch(self, blocks: Iterable[int]) -> None:
        """Take a reference on cached blocks found by a prefix hit."""
        self.watch_fired = True
        ref, free = self.ref_cnt, self.free_queue
        for b in blocks:
            if ref[b] == 0:
                del free[b]
            ref[b] += 1

    def allocate(self, n: int) -> list[int]:
        """``n`` fresh blocks from the head of the free queue, evicting what they cached."""
        if n > len(self.free_queue):
            raise RuntimeError(f"allocate({n}) with only {len(self.free_queue)} free blocks")
        if n >= MANY_BLOCKS:
            return self._allocate_many(n)
        out = []
        free, ref, hashes, cached = self.free_queue, self.ref_cnt, self.block_hash, self.cached
        watched = self.watched_blocks
        for _ in range(n):
            b, _none = free.popitem(last=False)
            h = hashes[b]
            if h is not None:
                if cached.get(h) == b:
                    del cached[h]
                hashes[b] = None
                if b in watched:
                    self.watch_fired = True
            ref[b] = 1
            out.append(b)
        return out

    def _allocate_many(self, n: int) -> list[int]:
        """``allocate`` for many blocks; the same result, since a block holds hash ``h`` exactly
        when ``cached[h]`` is that block (``cache_block`` and eviction set and clear both)."""
        free, hashes = self.free_queue, self.block_hash
        out = list(islice(free, n))
        _run(map(free.__delitem__, out))
        _run(map(self.ref_cnt.__setitem__, out, repeat(1)))
        evicted = [h for h in map(hashes.__getitem__, out) if h is not None]
        if evicted:
            _run(map(self.cached.__delitem__, evicted))
            _run(map(hashes.__setitem__, out, repeat(None)))
            if not self.watched_blocks.isdisjoint(out):
                self.watch_fired = True
        return out

    def free_blocks(self, blocks: Iterable[int]) -> None:
        """Drop one reference from each block; blocks reaching zero join the queue's tail in
        the order given (callers pass a request's blocks last-first, so its tail is evicted
        first)."""
        self.watch_fired = True
        ref, free = self.ref_cnt, self.free_queue
        blocks = list(blocks)
        if len(blocks) >= MANY_BLOCKS and list(map(ref.__getitem__, blocks)).count(1) == len(
            blocks
        ):  # all held by one request alone: they all join the queue
            _run(map(ref.__setitem__, blocks, repeat(0)))
            _run(map(free.__setitem__, blocks, repeat(None)))
            return
        for b in blocks:
            ref[b] -= 1
            if ref[b] == 0:
                free[b] = None
            elif ref[b] < 0:
                raise RuntimeError(f"block {b} freed more often than referenced")

    def cache_block(self, block: int, block_hash: int) -> None:
        """Record that ``block`` holds the full block ``block_hash`` (first holder wins)."""
        if self.block_hash[block] is None and block_hash not in self.cached:
            self.cached[block_hash] = block
            self.block_hash[block] = block_hash
            if block_hash in self.watched_hashes:
                self.watch_fired = True

    def cache_blocks(self, blocks: list[int], hashes: list[int], start: int, stop: int) -> None:
        """``cache_block(blocks[i], hashes[i])`` for ``i`` in ``range(start, stop)``."""
        block_hash, cached = self.block_hash, self.cached
        for i in range(start, stop):
            b, h = blocks[i], hashes[i]
            if block_hash[b] is None and h not in cached:
                cached[h] = b
                block_hash[b] = h
                if h in self.watched_hashes:
                    self.watch_fired = True

    def reset_prefix_cache(self) -> None:
        self.watch_fired = True
        for h, b in self.cached.items():
            if self.block_hash[b] == h:
                self.block_hash[b] = None
        self.cached.clear()
