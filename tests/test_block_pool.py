"""The block pool's lazy free queue against the plain rule: an OrderedDict in LRU order."""

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
    st.tuples(st.sampled_from(["alloc", "free", "hit", "cache"]), st.integers(0, 40)),
    max_size=120,
)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 48), ops, st.sampled_from([0, 64]))
def test_the_lazy_queue_keeps_lru_order(n, steps, slack):
    pool, plain = BlockPool(n), PlainPool(n)
    pool.compact_slack = slack  # 0: compacts whenever dead entries outnumber live ones
    held: list[list[int]] = []  # blocks of each "request", as the KV cache manager holds them
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
        assert pool.free_queue == list(plain.free)
        assert pool.num_free_blocks == len(plain.free)
        assert (pool.ref_cnt, pool.block_hash, pool.cached) == (plain.ref, plain.hash, plain.cached)
