"""The block pool's lazy free queue against the plain rule: an OrderedDict in LRU order; and its
watch on a chain of hashes (what a blocked queue head's lookup would find) against a lookup."""

from __future__ import annotations

from collections import OrderedDict

from hypothesis import given, settings
from hypothesis import strategies as st

from servefleet.engine.block_pool import BlockPool


class PlainPool:
    """vLLM's free queue as the plain rule: free blocks in the order they were freed; a prefix
    hit takes a free block out; allocation takes from the head and evicts what it cached."""

    def __init__(self, n: int) -> None:
        self.ref = [0] * n
        self.hash: list[int | None] = [None] * n
        self.cached: dict[int, int] = {}
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(n))

    def touch(self, blocks: list[int]) -> None:
        for b in blocks:
            if self.ref[b] == 0:
                del self.free[b]
            self.ref[b] += 1

    def allocate(self, n: int) -> list[int]:
        out = []
        for _ in range(n):
            b, _ = self.free.popitem(last=False)
            h = self.hash[b]
            if h is not None:
                if self.cached.get(h) == b:
                    del self.cached[h]
                self.hash[b] = None
            self.ref[b] = 1
            out.append(b)
        return out

    def free_blocks(self, blocks: list[int]) -> None:
        for b in blocks:
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free[b] = None

    def cache_block(self, b: int, h: int) -> None:
        if self.hash[b] is None and h not in self.cached:
            self.cached[h] = b
            self.hash[b] = h


ops = st.lists(
    st.tuples(st.sampled_from(["alloc", "free", "hit", "cache", "watch"]), st.integers(0, 40)),
    max_size=120,
)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 48), ops, st.sampled_from([0, 64]))
def test_the_lazy_queue_keeps_lru_order(n, steps, slack):
    pool, plain = BlockPool(n), PlainPool(n)
    pool.compact_slack = slack  # 0: compacts whenever dead entries outnumber live ones
    held: list[list[int]] = []  # blocks of each "request", as the KV cache manager holds them
    chain: list[int] | None = None  # watched hashes: some cached ones, then one that is not
    for op, k in steps:
        if op == "alloc" and 0 < k <= len(plain.free):
            got = plain.allocate(k)
            assert pool.allocate(k) == got
            held.append(got)
        elif op == "free" and held:
            blocks = held.pop(k % len(held))[::-1]  # a request frees its tail first
            pool.free_blocks(blocks)
            plain.free_blocks(blocks)
        elif op == "hit" and plain.cached:
            hits = sorted(plain.cached.values())[: 1 + k % 4]
            pool.touch(hits)
            plain.touch(hits)
            held.append(hits)
        elif op == "cache" and held:
            blocks = held[k % len(held)]
            b = blocks[k % len(blocks)]
            pool.cache_block(b, 1000 + k)
            plain.cache_block(b, 1000 + k)
        elif op == "watch":
            chain = [*list(plain.cached)[: k % 6], 2000 + k]
            pool.watch(chain, len(chain) - 1)
        if chain is not None and not pool.watch_fired:  # nothing freed, touched, re-cached
            found = next((i for i, h in enumerate(chain) if h not in plain.cached), len(chain))
            assert pool.watch_kept == found
        assert pool.free_queue == list(plain.free)
        assert pool.num_free_blocks == len(plain.free)
        assert (pool.ref_cnt, pool.block_hash, pool.cached) == (plain.ref, plain.hash, plain.cached)


def _cached_then_freed(n: int) -> BlockPool:
    """A pool of 20 blocks whose blocks 0..n-1 hold hashes 1000.. and are free: the free queue
    is 10..19 (never used), then n-1, ..., 0 (a request frees its tail first)."""
    pool = BlockPool(20)
    blocks = pool.allocate(n)
    for i, b in enumerate(blocks):
        pool.cache_block(b, 1000 + i)
    pool.free_blocks(blocks[::-1])
    return pool


def test_watch_keeps_the_chain_up_to_its_first_evicted_hash():
    pool = _cached_then_freed(10)
    pool.watch([1000, 1001, 1002, 5000], 3)  # three cached, then one that is not
    for _ in range(17):  # one at a time: 10..19 and 9..3
        pool.allocate(1)
    assert (pool.watch_kept, pool.watch_evicted, pool.watch_fired) == (3, False, False)
    pool.allocate(1)  # block 2: hash 1002
    assert (pool.watch_kept, pool.watch_evicted) == (2, True)
    pool.allocate(1)
    assert pool.watch_kept == 1
    pool.cache_block(pool.allocate(1)[0], 1001)  # block 0 (1000 evicted), 1001 cached again
    assert pool.watch_kept == 0 and pool.watch_fired


def test_watch_sees_evictions_of_many_blocks_at_once():
    pool = _cached_then_freed(10)
    pool.watch([1000, 1001, 1002, 1003, 5000], 4)
    pool.allocate(18)  # 10..19 and 9..2 at once: evicts hash 1002 (block 2) and 1003
    assert pool.watch_kept == 2
