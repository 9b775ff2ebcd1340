"""Helpers shared by the engine tests (no mocks: the real schedulers and block pools)."""

from __future__ import annotations

from servefleet.engine.request import Request, SegmentContent
from servefleet.engine.scheduler import Scheduler, SchedulerOutput
from servefleet.fastpath.block_pool import BlockTable
from servefleet.fastpath.request import Request as FastRequest
from servefleet.fastpath.scheduler import Scheduler as FastScheduler
from servefleet.tokens import Segment, user_key


def slot_names(cls: type) -> tuple[str, ...]:
    """The instance attributes of a class with ``__slots__``; compiled by mypyc
    (servefleet/compiled.py) it has no ``__slots__`` but lists them in ``__mypyc_attrs__``."""
    names = getattr(cls, "__slots__", None)
    return tuple(names if names is not None else cls.__mypyc_attrs__)  # type: ignore[attr-defined]


def make_request(
    rid: str, prompt: int, out: int, prefix: tuple[str, int] | None = None, fast: bool = False
) -> Request:
    """A request of ``prompt`` tokens (after a shared ``prefix``: (key, tokens)) for the plain
    scheduler, or for the fast one (``fast``)."""
    segs = []
    if prefix:
        segs.append(Segment(prefix[0], prefix[1], "system"))
    segs.append(Segment(user_key(rid), prompt - (prefix[1] if prefix else 0)))
    cls = FastRequest if fast else Request
    return cls(rid, prompt, out, SegmentContent(segs, rid))


def check_invariants(s: Scheduler, out: SchedulerOutput | None = None) -> None:
    """The plain scheduler's blocks and counters are consistent."""
    pool, cfg, kv = s.kv.block_pool, s.config, s.kv
    used = sum(1 for r in pool.ref_cnt if r > 0)
    assert used + pool.num_free_blocks == pool.num_blocks, "free + used != total"
    assert all(r >= 0 for r in pool.ref_cnt), "negative ref count"
    assert all(pool.ref_cnt[b] == 0 for b in pool.free_queue), "referenced block in free queue"
    held: dict[int, int] = {}
    for blocks in kv.blocks.values():
        for b in blocks:
            held[b] = held.get(b, 0) + 1
    for b, n in held.items():
        assert pool.ref_cnt[b] == n, f"block {b}: ref {pool.ref_cnt[b]} != holders {n}"
    assert used == len(held), "a referenced block no request holds"
    assert set(kv.blocks) <= {r.request_id for r in s.running}, "blocks of a request not running"
    assert len(s.running) <= cfg.max_num_seqs
    for req in s.running:
        need = -(-req.num_computed_tokens // cfg.block_size)
        assert kv.num_blocks_of(req) >= need
        assert req.num_computed_tokens <= req.num_tokens
    for h, b in pool.cached.items():
        assert pool.block_hash[b] == h
    if out is not None:
        assert out.num_tokens <= cfg.max_num_batched_tokens
        assert sum(out.num_scheduled) == out.num_tokens
        assert all(n > 0 for n in out.num_scheduled)


def block_tables(s: FastScheduler) -> dict[str, BlockTable]:
    """Each request's block table in the fast scheduler, by request id (those with blocks)."""
    return {r.request_id: r.block_table for r in s.requests.values() if r.block_table is not None}


def check_fast_invariants(s: FastScheduler) -> None:
    """The fast scheduler's blocks (named and blank) and counters are consistent."""
    pool = s.kv.block_pool
    cfg = s.config
    named = sum(1 for r in pool.ref_cnt if r > 0)
    blank = sum(t.blank for t in block_tables(s).values())
    assert named + blank + pool.num_free_blocks == pool.num_blocks, "free + used != total"
    assert all(r >= 0 for r in pool.ref_cnt), "negative ref count"
    assert all(pool.ref_cnt[b] == 0 for b in pool.free_queue if b is not None), (
        "referenced block in free queue"
    )
    assert all(pool.block_hash[b] is not None for b in pool.free_queue if b is not None), (
        "a named free block holds no hash"
    )
    # every named block is held by some request, as many times as its ref count
    held: dict[int, int] = {}
    for table in block_tables(s).values():
        assert table.blank >= 0
        for b in table.named:
            held[b] = held.get(b, 0) + 1
    for b, n in held.items():
        assert pool.ref_cnt[b] == n, f"block {b}: ref {pool.ref_cnt[b]} != holders {n}"
    assert named == len(held), "a referenced id no request holds"
    assert len(s.running) <= cfg.max_num_seqs
    for req in s.running:
        need = -(-req.num_computed_tokens // cfg.block_size)
        assert s.kv.num_blocks_of(req) >= need
        assert req.num_slots == s.kv.num_blocks_of(req) * cfg.block_size
        assert req.num_computed_tokens <= req.num_tokens
    for h, b in pool.cached.items():
        assert pool.block_hash[b] == h
