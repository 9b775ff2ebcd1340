"""Paged KV blocks with prefix caching (vLLM V1's ``BlockPool``).

A block is free when no request references it. Free blocks wait in an LRU queue: a block
freed last is evicted last, and a free block that still holds a cached (hashed) full block can
be reused by a later request with the same prefix until it is evicted.

The queue is a list of block ids read from a head index (``_queue[_head:]``), with lazy
deletion (an ``OrderedDict`` costs ~140 bytes and a pointer chase per block; a fleet simulation
keeps hundreds of pools of thousands of blocks; a list, not a deque: compiled, its items are
read and appended without a method call). A block taken out of the middle (a prefix hit on a
free block) leaves its entry behind, and a block is appended each time it is freed: an entry is
live when its block is free and it is the block's last entry (``_entries`` counts them).
``allocate`` takes from the head and skips dead entries; the list drops the entries before its
head once there are ``_DROP_HEAD`` of them, and is compacted when dead entries outnumber live
ones. The live entries are in
LRU order: ``tests/test_block_pool.py`` checks the pool against one built on an OrderedDict.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import count

_DROP_HEAD = 1024
"""Taken entries at the head of the queue that may stay before they are dropped (each holds its
block's id, an int object: ~36 bytes; dropping them moves the rest of the list, so not often)."""


class BlockPool:
    __slots__ = (
        "_dead",
        "_entries",
        "_head",
        "_queue",
        "block_hash",
        "cached",
        "compact_slack",
        "num_blocks",
        "num_free_blocks",
        "ref_cnt",
        "watch_count",
        "watch_fired",
        "watch_kept",
        "watched",
    )

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.ref_cnt = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}
        """Hash of a full block -> the block holding it."""
        self._queue: list[int] = list(range(num_blocks))
        """From ``_head`` on: the free blocks, least recently freed first (the eviction order),
        and dead entries."""
        self._head = 0
        self._entries = [1] * num_blocks
        """Entries of each block in ``_queue``."""
        self._dead = 0
        self.compact_slack = 64
        """Dead entries beyond the live ones that trigger a compaction."""
        self.num_free_blocks = num_blocks
        self.watched: dict[int, int] = {}
        """The watched chain of hashes: hash -> its position."""
        self.watch_fired = True
        """False while none of these has happened since ``watch``: a block freed or touched,
        a watched hash cached."""
        self.watch_count = 0
        self.watch_kept = 0
        """How many of the first ``watch_count`` watched hashes are still cached, from the
        first (the eviction of the one at position ``i`` cuts it to ``i``)."""

    @property
    def free_queue(self) -> list[int]:
        """The free blocks, least recently freed first (the eviction order)."""
        left, ref = list(self._entries), self.ref_cnt
        out = []
        for b in self._queue[self._head :]:
            left[b] -= 1
            if not left[b] and not ref[b]:
                out.append(b)
        return out

    @property
    def usage(self) -> float:
        """Fraction of blocks referenced by requests (vLLM's ``kv_cache_usage_perc``)."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def get_cached_block(self, block_hash: int) -> int | None:
        return self.cached.get(block_hash)

    def watch(self, hashes: Iterable[int], cached: int) -> None:
        """Start watching a chain of hashes whose first ``cached`` are cached: for the caching
        of any of them, or any block freed or touched (``watch_fired``), and for the eviction
        of those cached (``watch_kept``, ``watch_evicted``)."""
        self.watched = dict(zip(hashes, count()))
        self.watch_fired = False
        self.watch_count = self.watch_kept = cached

    @property
    def watch_evicted(self) -> bool:
        """One of the cached watched hashes has been evicted since ``watch``."""
        return self.watch_kept < self.watch_count

    def touch(self, blocks: Iterable[int]) -> None:
        """Take a reference on cached blocks found by a prefix hit."""
        self.watch_fired = True
        ref = self.ref_cnt
        for b in blocks:
            if ref[b] == 0:  # leaves the queue: its entry dies
                self.num_free_blocks -= 1
                self._dead += 1
            ref[b] += 1

    def allocate(self, n: int) -> list[int]:
        """``n`` fresh blocks from the head of the free queue, evicting what they cached."""
        self.reserve(n)
        return self.take(n)

    def reserve(self, n: int) -> None:
        """Count ``n`` free blocks out now, for ``take`` to pop later (the lazy scheduler's
        overflows, ``engine.cruise``: it takes them before anything else reads or changes the
        queue or the cache)."""
        if n > self.num_free_blocks:
            raise RuntimeError(f"allocate({n}) with only {self.num_free_blocks} free blocks")
        self.num_free_blocks -= n

    def take(self, n: int) -> list[int]:
        """The ``n`` blocks at the head of the free queue, counted out by ``reserve``: they
        leave the queue, referenced once, evicting what they cached.

        Plain loops, and the list's own methods called (compiled, a bound method kept in a
        local is called as a Python object)."""
        out: list[int] = []
        queue, head = self._queue, self._head
        entries, ref, hashes = self._entries, self.ref_cnt, self.block_hash
        dead = 0
        while n:
            b = queue[head]
            head += 1
            e = entries[b] - 1
            entries[b] = e
            if e or ref[b]:
                dead += 1
                continue
            h = hashes[b]
            if h is not None:
                self._evict(b, h)
            ref[b] = 1
            out.append(b)
            n -= 1
        self._dead -= dead
        if head >= _DROP_HEAD:  # the taken entries hold their ints: at most this many
            del queue[:head]
            head = 0
        self._head = head
        return out

    def _evict(self, b: int, h: int) -> None:
        """Free block ``b``, taken from the queue, no longer holds ``h``."""
        cached, watched = self.cached, self.watched
        if cached.get(h) == b:
            del cached[h]
            if h in watched and watched[h] < self.watch_kept:
                self.watch_kept = watched[h]
        self.block_hash[b] = None

    def free_blocks(self, blocks: Iterable[int]) -> None:
        """Drop one reference from each block; blocks reaching zero join the queue's tail in
        the order given (callers pass a request's blocks last-first, so its tail is evicted
        first)."""
        self.watch_fired = True
        ref, entries, queue = self.ref_cnt, self._entries, self._queue
        freed = 0
        for b in blocks:
            r = ref[b] - 1
            ref[b] = r
            if r == 0:
                queue.append(b)
                entries[b] += 1
                freed += 1
            elif r < 0:
                self.num_free_blocks += freed
                raise RuntimeError(f"block {b} freed more often than referenced")
        self.num_free_blocks += freed
        if self._dead > self.num_free_blocks + self.compact_slack:
            self._compact()

    def _compact(self) -> None:
        """Drop the dead entries (the live ones keep their order)."""
        live = self.free_queue
        self._queue = live
        self._head = 0
        entries = self._entries = [0] * self.num_blocks
        for b in live:
            entries[b] = 1
        self._dead = 0

    def cache_block(self, block: int, block_hash: int) -> None:
        """Record that ``block`` holds the full block ``block_hash`` (first holder wins)."""
        if self.block_hash[block] is None and block_hash not in self.cached:
            self.cached[block_hash] = block
            self.block_hash[block] = block_hash
            if block_hash in self.watched:
                self.watch_fired = True

    def cache_blocks(self, blocks: list[int], hashes: list[int], start: int, stop: int) -> None:
        """``cache_block(blocks[i], hashes[i])`` for ``i`` in ``range(start, stop)``."""
        block_hash, cached = self.block_hash, self.cached
        for i in range(start, stop):
            b, h = blocks[i], hashes[i]
            if block_hash[b] is None and h not in cached:
                cached[h] = b
                block_hash[b] = h
                if h in self.watched:
                    self.watch_fired = True
