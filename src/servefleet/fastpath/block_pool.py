"""Paged KV blocks with prefix caching (vLLM V1's ``BlockPool``).

A block is free when no request references it. Free blocks wait in an LRU queue: a block
freed last is evicted last, and a free block that still holds a cached (hashed) full block can
be reused by a later request with the same prefix until it is evicted.

**Blank blocks are counted, not named.** A block that holds no hash is *blank*: no lookup can
find it and nothing can tell it from another blank block, so which one a request gets changes
nothing (vLLM's block ids are never seen outside its engine). The pool names a block (gives it
an id) only when a request caches it (``name``), and takes the name back when the block is
blank again: evicted (taken from the queue's head as a fresh block) or freed uncached. A
request's blocks are a ``BlockTable``: its named blocks (a prefix: caching always extends one),
then a count of blank ones; the free queue keeps blank blocks as runs (one entry, however many).
So allocating and freeing a request's blank blocks, in a fleet most of them (content a
request owns is never cached: ``fastpath.contract``), costs one entry, not one a block.

The queue is a list read from a head index (``_queue[_head:]``): an entry ``>= 0`` is a named
(hashed) block, ``-k`` a run of ``k`` blank ones (a list rather than an ``OrderedDict`` or a
deque: docs/engine.md, "How it is made fast"). Named entries are deleted lazily: a block taken
out of the middle (a prefix hit on a free block) leaves its entry behind, and a block is
appended each time it is freed; an entry is live when its block is free and it is the block's last entry (``_entries``
counts them). ``take`` reads from the head and skips dead entries; the list drops the entries
before its head once there are ``_DROP_HEAD`` of them, and is compacted when dead entries
outnumber live ones. The live entries are in LRU order: ``tests/test_block_pool.py`` checks the
pool against one that names every block, on an OrderedDict.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import count
from typing import Final

_DROP_HEAD: Final = 1024
"""Taken entries at the head of the queue that may stay before they are dropped (dropping them
moves the rest of the list, so not often)."""


class BlockTable:
    """One request's KV blocks, in order: ``named`` (cached ones, or ones it tried to cache:
    another block held the hash first), then ``blank`` blocks."""

    __slots__ = ("blank", "named")

    def __init__(self) -> None:
        self.named: list[int] = []
        self.blank = 0

    @property
    def num_blocks(self) -> int:
        return len(self.named) + self.blank


class BlockPool:
    __slots__ = (
        "_dead",
        "_entries",
        "_head",
        "_queue",
        "_spare",
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
        self.ref_cnt: list[int] = []
        """References to each named block (by id). Ids are made as blocks are first named
        (``name``), so a pool whose blocks are never cached holds none."""
        self.block_hash: list[int | None] = []
        self.cached: dict[int, int] = {}
        """Hash of a full block -> the (named) block holding it."""
        self._spare: list[int] = []
        """The ids made that no block has now (``name`` takes the last)."""
        self._queue: list[int] = [-num_blocks]
        """From ``_head`` on: the free blocks, least recently freed first (the eviction order),
        named ones by id and blank ones as runs (``-k``), and dead entries."""
        self._head = 0
        self._entries: list[int] = []
        """Entries of each id in ``_queue``."""
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

    def _live(self) -> list[int]:
        """The live entries, in order, a blank run as one entry (runs next to each other
        merged)."""
        left, ref = list(self._entries), self.ref_cnt
        out: list[int] = []
        for e in self._queue[self._head :]:
            if e < 0:
                if out and out[-1] < 0:
                    out[-1] += e
                else:
                    out.append(e)
                continue
            left[e] -= 1
            if not left[e] and not ref[e]:
                out.append(e)
        return out

    @property
    def free_queue(self) -> list[int | None]:
        """The free blocks, least recently freed first (the eviction order): a named block's
        id, None for a blank one."""
        out: list[int | None] = []
        for e in self._live():
            if e < 0:
                out += [None] * -e
            else:
                out.append(e)
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

    def allocate(self, n: int) -> None:
        """Take ``n`` fresh (blank) blocks from the head of the free queue, evicting what they
        cached; the caller counts them into a ``BlockTable``."""
        self.reserve(n)
        self.take(n)

    def reserve(self, n: int) -> None:
        """Count ``n`` free blocks out now, for ``take`` to take later (the lazy scheduler's
        overflows, ``fastpath.cruise``: it takes them before anything else reads or changes the
        queue or the cache)."""
        if n > self.num_free_blocks:
            raise RuntimeError(f"allocate({n}) with only {self.num_free_blocks} free blocks")
        self.num_free_blocks -= n

    def take(self, n: int) -> None:
        """Take the ``n`` blocks at the head of the free queue, counted out by ``reserve``:
        they leave the queue blank, evicting what they cached (their ids go back).

        Plain loops that call the list's own methods (docs/simulate.md, "A compiled core")."""
        queue, head = self._queue, self._head
        entries, ref, hashes = self._entries, self.ref_cnt, self.block_hash
        dead = 0
        while n:
            e = queue[head]
            if e < 0:  # a run of -e blank blocks
                if -e > n:
                    queue[head] = e + n
                    break
                n += e
                head += 1
                continue
            head += 1
            left = entries[e] - 1
            entries[e] = left
            if left or ref[e]:
                dead += 1
                continue
            h = hashes[e]
            if h is not None:
                self._evict(e, h)
            self._spare.append(e)
            n -= 1
        self._dead -= dead
        if head >= _DROP_HEAD:
            del queue[:head]
            head = 0
        self._head = head

    def _evict(self, b: int, h: int) -> None:
        """Free block ``b``, taken from the queue, no longer holds ``h``."""
        cached, watched = self.cached, self.watched
        if cached.get(h) == b:
            del cached[h]
            if h in watched and watched[h] < self.watch_kept:
                self.watch_kept = watched[h]
        self.block_hash[b] = None

    def name(self, n: int) -> list[int]:
        """Ids for ``n`` blank blocks a request holds, about to be cached (each referenced
        once, by that request)."""
        spare, ref = self._spare, self.ref_cnt
        out: list[int] = []
        for _ in range(n):
            if spare:
                b = spare.pop()
                ref[b] = 1
            else:  # a new id (at most num_blocks are ever made: one per block)
                b = len(ref)
                ref.append(1)
                self.block_hash.append(None)
                self._entries.append(0)
            out.append(b)
        return out

    def _append_blank(self, k: int) -> None:
        queue = self._queue
        if len(queue) > self._head and queue[-1] < 0:
            queue[-1] -= k
        else:
            queue.append(-k)

    def free_blocks(self, blocks: Iterable[int], blank: int = 0) -> None:
        """Drop one reference from each of a request's blocks: blocks reaching zero join the
        queue's tail, first its ``blank`` ones (its tail: a request frees its tail first, so
        it is evicted first), then the named ``blocks`` in the order given (callers pass them
        last-first). A named block that holds no hash is blank once free."""
        self.watch_fired = True
        ref, entries, queue, hashes = self.ref_cnt, self._entries, self._queue, self.block_hash
        if blank:
            self._append_blank(blank)
        freed = blank
        for b in blocks:
            r = ref[b] - 1
            ref[b] = r
            if r == 0:
                if hashes[b] is None:
                    self._spare.append(b)
                    self._append_blank(1)
                else:
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
        live = self._live()
        self._queue = live
        self._head = 0
        entries = self._entries = [0] * len(self.ref_cnt)
        for e in live:
            if e >= 0:
                entries[e] = 1
        self._dead = 0

    def cache_block(self, block: int, block_hash: int) -> None:
        """Record that named ``block`` holds the full block ``block_hash`` (first holder wins)."""
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
