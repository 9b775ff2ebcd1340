"""The fast path's block pool (its lazy free queue, blank blocks counted, not named) against the
plain rule's (``engine.block_pool``: every block named, an OrderedDict in LRU order); and its
watch on a chain of hashes (what a blocked queue head's lookup would find) against a lookup."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from servefleet.engine.block_pool import BlockPool as PlainPool
from servefleet.fastpath.block_pool import BlockPool, BlockTable

ops = st.lists(
    st.tuples(st.sampled_from(["alloc", "free", "hit", "cache", "watch"]), st.integers(0, 40)),
    max_size=120,
)


class Held:
    """A request's blocks: in the plain pool, ids; in ours, a ``BlockTable`` (its first
    ``len(named)`` are the plain ones' first, the rest blank)."""

    def __init__(self, plain: list[int], named: list[int], blank: int) -> None:
        self.plain = plain
        self.table = BlockTable()
        self.table.named[:] = named
        self.table.blank = blank


def _labels(pool: BlockPool, plain: PlainPool, held: list[Held]) -> None:
    """Both pools hold the same hashes in the same places: the free queue (in order) and each
    request's blocks (a block shown by its hash, None if it holds none)."""
    assert [None if b is None else pool.block_hash[b] for b in pool.free_queue] == [
        plain.block_hash[b] for b in plain.free
    ]
    for h in held:
        t = h.table
        mine = [pool.block_hash[b] for b in t.named] + [None] * t.blank
        assert mine == [plain.block_hash[b] for b in h.plain]
    assert pool.cached.keys() == plain.cached.keys()
    assert all(pool.block_hash[b] == h for h, b in pool.cached.items())


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 48), ops, st.sampled_from([0, 64]))
def test_the_lazy_queue_keeps_lru_order(n, steps, slack):
    pool, plain = BlockPool(n), PlainPool(n)
    pool.compact_slack = slack  # 0: compacts whenever dead entries outnumber live ones
    held: list[Held] = []  # the blocks of each "request", as the KV cache manager holds them
    chain: list[int] | None = None  # watched hashes: some cached ones, then one that is not
    for op, k in steps:
        if op == "alloc" and 0 < k <= len(plain.free):
            pool.allocate(k)
            held.append(Held(plain.allocate(k), [], k))
        elif op == "free" and held:
            h = held.pop(k % len(held))
            pool.free_blocks(reversed(h.table.named), h.table.blank)  # its tail first
            plain.free_blocks(h.plain[::-1])
        elif op == "hit" and plain.cached:
            hashes = sorted(plain.cached)[: 1 + k % 4]
            hits = [pool.cached[x] for x in hashes]
            pool.touch(hits)
            plain.touch([plain.cached[x] for x in hashes])
            held.append(Held([plain.cached[x] for x in hashes], hits, 0))
        elif op == "cache" and held:  # the next block of a request (caching extends a prefix)
            h = held[k % len(held)]
            t = h.table
            if t.blank:
                plain.cache_block(h.plain[len(t.named)], 1000 + k)
                t.named += pool.name(1)
                t.blank -= 1
                pool.cache_block(t.named[-1], 1000 + k)
        elif op == "watch":
            chain = [*list(plain.cached)[: k % 6], 2000 + k]
            pool.watch(chain, len(chain) - 1)
        if chain is not None and not pool.watch_fired:  # nothing freed, touched, re-cached
            found = next((i for i, h in enumerate(chain) if h not in plain.cached), len(chain))
            assert pool.watch_kept == found
        _labels(pool, plain, held)
        assert pool.num_free_blocks == len(plain.free)
        named = sum(len(h.table.named) for h in held)
        assert sum(pool.ref_cnt) == named
        # every id made names one block, in use or free, or is spare
        in_use = sum(1 for r in pool.ref_cnt if r)
        free = sum(1 for b in pool.free_queue if b is not None)
        assert in_use + len(pool._spare) + free == len(pool.ref_cnt) <= n


def _cached_then_freed(n: int) -> BlockPool:
    """A pool of 20 blocks whose first ``n`` allocated hold hashes 1000.. and are free: the
    free queue is 10 never used (blank), then the cached ones from hash 1000 + n - 1 down to
    1000 (a request frees its tail first)."""
    pool = BlockPool(20)
    pool.allocate(n)
    blocks = pool.name(n)
    for i, b in enumerate(blocks):
        pool.cache_block(b, 1000 + i)
    pool.free_blocks(blocks[::-1])
    return pool


def test_watch_keeps_the_chain_up_to_its_first_evicted_hash():
    pool = _cached_then_freed(10)
    pool.watch([1000, 1001, 1002, 5000], 3)  # three cached, then one that is not
    for _ in range(17):  # one at a time: the 10 blank and 1009..1003
        pool.allocate(1)
    assert (pool.watch_kept, pool.watch_evicted, pool.watch_fired) == (3, False, False)
    pool.allocate(1)  # hash 1002
    assert (pool.watch_kept, pool.watch_evicted) == (2, True)
    pool.allocate(1)
    assert pool.watch_kept == 1
    pool.allocate(1)  # 1000 evicted
    pool.cache_block(pool.name(1)[0], 1001)  # 1001 cached again
    assert pool.watch_kept == 0 and pool.watch_fired


def test_watch_sees_evictions_of_many_blocks_at_once():
    pool = _cached_then_freed(10)
    pool.watch([1000, 1001, 1002, 1003, 5000], 4)
    pool.allocate(18)  # the 10 blank and 1009..1002 at once: evicts 1002 and 1003
    assert pool.watch_kept == 2


def test_blank_blocks_are_runs():
    """A request's blank blocks are allocated and freed as one queue entry however many."""
    pool = BlockPool(1000)
    for _ in range(50):
        pool.allocate(300)
        pool.allocate(300)
        pool.free_blocks([], 300)
        pool.free_blocks([], 300)
    assert len(pool._queue) - pool._head <= 2
    assert pool.num_free_blocks == 1000 and not any(pool.ref_cnt)
