"""The fast path's scheduler (``servefleet.fastpath``) changes how much work a step takes, never
what it does: lazy decodes (fastpath/cruise.py), caching a private output's blocks late and a
the blocks of a request's own content only if it is preempted (fastpath/private_output.py,
fastpath/contract.py), and skipping a blocked queue head while nothing changed
(``KVCacheManager.still_blocked``). It and the plain rule (``engine.scheduler``), fed the same
requests (sessions that resend an answer before, while and after it is
generated, shared system prompts, one-off requests no turn resends), aborts and steps, schedule
the same batches, finish the same requests, keep the same blocks, and end with the same
counters and prefix cache but for blocks no lookup can find (a one-off request's own); between,
the lazy one's free count is the same, and once the blocks its overflows owe are taken, its
blocks too and its cache lacks only blocks of private outputs and unfindable ones."""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator
from contextlib import contextmanager

from hypothesis import given, settings
from hypothesis import strategies as st

from engine_helpers import block_tables, check_fast_invariants, slot_names
from servefleet.engine.config import SchedulerConfig
from servefleet.engine.request import Request as PlainRequest
from servefleet.engine.request import RequestStatus
from servefleet.engine.scheduler import Scheduler as PlainScheduler
from servefleet.fastpath.block_pool import BlockPool
from servefleet.fastpath.contract import OwnContent
from servefleet.fastpath.request import Request
from servefleet.fastpath.scheduler import Scheduler, SchedulerOutput
from servefleet.tokens import Segment, SegmentContent, output_key, user_key

AnyScheduler = Scheduler | PlainScheduler


def _ids(reqs: list) -> list[str]:
    return [r.request_id for r in reqs]


def _step_view(out, finished: list, listed: bool = True) -> tuple:
    """What a step did; ``listed=False``: but which requests it scheduled, for a lazy
    scheduler whose outputs do not list them (``enable_lazy_decodes(step_requests=False)``)."""
    return (
        _ids(out.reqs) if listed and out.reqs is not None else None,
        out.num_scheduled if listed else None,
        out.num_seqs,
        _ids(out.preempted),
        out.num_tokens,
        out.num_decodes,
        out.decode_context,
        out.prefill_chunks,
        out.num_sampled,
        _ids(out.first_tokens),
        _ids(finished),
    )


def _labels(s: AnyScheduler, unfindable: set[int]) -> tuple[dict[str, list], list]:
    """Each request's blocks and the free queue, each block shown by the hash it holds (None:
    none, or one no lookup can find). Block ids do not say more: the fast pool names only the
    blocks it caches (``fastpath.block_pool``), and a hash is held by one block at most."""
    hashes = s.kv.block_pool.block_hash

    def label(b: int | None) -> int | None:
        h = hashes[b] if b is not None else None
        return None if h in unfindable else h

    if isinstance(s, PlainScheduler):
        tables = {rid: [label(b) for b in blocks] for rid, blocks in s.kv.blocks.items() if blocks}
    else:
        tables = {
            rid: [label(b) for b in t.named] + [None] * t.blank
            for rid, t in block_tables(s).items()
            if t.num_blocks
        }
    return tables, [label(b) for b in s.kv.block_pool.free_queue]


def _kv_view(s: AnyScheduler, unfindable: set[int]) -> tuple:
    """All but the prefix cache of blocks in use (``_check_cache``) and hashes no lookup can
    find."""
    tables, free = _labels(s, unfindable)
    return ({rid: len(t) for rid, t in tables.items()}, free, s.kv.stats)


def _check_cache(lazy: Scheduler, eager: PlainScheduler, unfindable: set[int]) -> None:
    """The lazy pool caches what the plain one does, in the same blocks, but blocks private
    outputs filled and blocks no lookup can find."""
    mine, plain = _labels(lazy, unfindable)[0], _labels(eager, unfindable)[0]
    private = {r.request_id for r in lazy.running if r.private_output}
    for rid, labels in mine.items():
        for pos, (a, b) in enumerate(zip(labels, plain[rid], strict=True)):
            assert a == b or (a is None and rid in private), (rid, pos, a, b)


@contextmanager
def _settled(s: Scheduler) -> Iterator[Scheduler]:
    """``s`` with the blocks its cruising requests' overflows owe taken (``Cruise.settle``,
    what the scheduler does before anything reads the free queue or the cache) and counted in
    their tables (``Cruise.tables_settled``), and back as it was afterwards: the test looks at
    the pool without settling the scheduler it runs."""
    pool, cruise = s.kv.block_pool, s.cruise
    assert cruise is not None
    fields = {name: copy.copy(getattr(pool, name)) for name in slot_names(BlockPool)}
    tables = {rid: (t, list(t.named), t.blank) for rid, t in block_tables(s).items()}
    slots = [(r, r.num_slots, r.cruise_tabled) for r in s.running]
    owed = cruise.owed_step, cruise.owed_pos
    cruise.settle(s.step_index)
    cruise.tables_settled()
    yield s
    for name, value in fields.items():
        setattr(pool, name, value)
    for table, named, blank in tables.values():
        table.named[:] = named
        table.blank = blank
    for r, n, tabled in slots:
        r.num_slots = n
        r.cruise_tabled = tabled
    cruise.owed_step, cruise.owed_pos = owed


def _request_view(r, s: AnyScheduler) -> tuple:
    return (
        r.request_id,
        r.status,
        r.num_computed_tokens,
        r.num_output_tokens,
        s.kv.num_blocks_of(r),
        r.num_preemptions,
        r.num_recomputed_tokens,
        r.num_cached_tokens,
        r.first_scheduled_step,
        r.token_runs,
    )


def _state_view(s: AnyScheduler) -> tuple:
    return (
        [_request_view(r, s) for r in s.running],
        [_request_view(r, s) for r in s.waiting],
        s.step_index,
    )


def _twin_requests(
    rid: str, segments: list[Segment], olen: int, own_from: int
) -> tuple[PlainRequest, Request]:
    """The same request for the plain scheduler and for the fast one (``own_from``: where its
    own content starts, ``fastpath.contract``)."""
    n = sum(s.length for s in segments)
    plain = PlainRequest(rid, n, olen, SegmentContent(segments, rid))
    return plain, Request(rid, n, olen, SegmentContent(segments, rid), 0.0, own_from)


def _prompt(rid: str, plen: int, group: int) -> list[Segment]:
    """A shared system prompt of group ``group``, then the user's tokens."""
    shared = min(plen, 48)
    return [Segment(f"g{group}", shared, "system"), Segment(user_key(rid), plen - shared)]


def _next_turn(rid: str, prev: str, prompt: list[Segment], answer: int, plen: int) -> list:
    """A session's next turn: the previous prompt, ``answer`` tokens of its answer, new ones."""
    return [*prompt, Segment(output_key(prev), answer), Segment(user_key(rid), plen)]


OPS = ["add", "add", "one-off", "turn", "pair", "abort", "step", "step", "step", "step", "step"]


@settings(max_examples=80, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(OPS), st.integers(1, 300), st.integers(1, 80), st.integers(0, 3)),
        min_size=1,
        max_size=150,
    ),
    blocks=st.integers(20, 120),
    budget=st.sampled_from([8, 32, 64, 256, 2048]),
    caching=st.booleans(),
    async_scheduling=st.booleans(),
    block_size=st.sampled_from([1, 4, 16]),
    step_requests=st.booleans(),
)
def test_shortcuts_schedule_exactly_as_plain_scheduler(
    ops, blocks, budget, caching, async_scheduling, block_size, step_requests
):
    cfg = SchedulerConfig(
        num_gpu_blocks=blocks,
        max_num_seqs=8,
        max_num_batched_tokens=budget,
        block_size=block_size,
        enable_prefix_caching=caching,
        async_scheduling=async_scheduling,
    )
    _run_twins(cfg, ops, step_requests=step_requests)


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    capacity=st.integers(300, 1500),
    budget=st.sampled_from([64, 512, 4096]),
    block_size=st.sampled_from([1, 4, 16]),
)
def test_long_sessions_schedule_exactly_as_plain_scheduler(seed, capacity, budget, block_size):
    """Long random runs with prefix caching and long answers (hypothesis's lists stay short):
    turns resend answers still being generated, blocks run short, requests are preempted."""
    rng = random.Random(seed)
    ops = [
        (rng.choice(OPS), rng.randint(1, 120), rng.randint(1, 250), rng.randint(0, 3))
        for _ in range(300)
    ]
    cfg = SchedulerConfig(
        num_gpu_blocks=capacity // block_size,
        max_num_seqs=16,
        max_num_batched_tokens=budget,
        block_size=block_size,
        enable_prefix_caching=True,
        async_scheduling=rng.random() < 0.5,
    )
    _run_twins(cfg, ops, look=97, step_requests=rng.random() < 0.5)


def _run_twins(
    cfg: SchedulerConfig,
    ops: list[tuple[str, int, int, int]],
    look: int = 11,
    step_requests: bool = True,
) -> None:
    """A lazy scheduler and a plain one on the same operations: the same at every step, and
    in everything every ``look`` operations. ``step_requests``: whether the lazy one's
    outputs list their requests (the event loop's do not)."""
    eager, lazy = PlainScheduler(cfg), Scheduler(cfg)
    lazy.enable_lazy_decodes(step_requests)
    contract = OwnContent()
    prompts: dict[str, list[Segment]] = {}
    one_offs: dict[str, tuple[PlainRequest, int]] = {}
    """The requests no turn resends (their plain twins, and where their own content starts)."""
    limit = (cfg.num_gpu_blocks - 1) * cfg.block_size

    def add(rid: str, segments: list[Segment], olen: int, one_off: bool = False) -> bool:
        if sum(s.length for s in segments) + olen > limit:
            return False
        prompts[rid] = segments
        own = contract.own_from(rid, segments, in_session=not one_off)
        a, b = _twin_requests(rid, segments, olen, own)
        eager.add_request(a)
        lazy.add_request(b)
        if one_off:
            one_offs[rid] = a, own
        return True

    def unfindable() -> set[int]:
        """The hashes of the one-off requests' blocks of their own content (as far as the
        plain scheduler has hashed them)."""
        bs = cfg.block_size
        return {h for r, own in one_offs.values() for h in r.block_hashes[own // bs :]}

    held: list[tuple[SchedulerOutput, list[str]]] = []
    """The lazy scheduler's last outputs, with their requests then: a lazy step's ``reqs``
    is the running list itself until that changes (copied first), so it must not change."""

    def check_held() -> None:
        for out, ids in held:
            assert (_ids(out.reqs) if out.reqs is not None else None) == ids

    def step() -> None:
        out_e, out_l = eager.schedule(), lazy.schedule()
        fin_e = eager.update_from_output(out_e, eager.step_index - 1)
        fin_l = lazy.update_from_output(out_l, lazy.step_index - 1)
        assert _step_view(out_l, fin_l, step_requests) == _step_view(out_e, fin_e, step_requests)
        assert (out_l.reqs is not None) == step_requests
        check_held()
        held[:] = [*held[-2:], (out_l, _ids(out_l.reqs) if out_l.reqs is not None else None)]
        assert lazy.kv.block_pool.num_free_blocks == eager.kv.block_pool.num_free_blocks
        gone = unfindable()
        with _settled(lazy):
            assert _kv_view(lazy, gone) == _kv_view(eager, gone)
            _check_cache(lazy, eager, gone)
        for r in fin_l:  # a finished request is up to date
            twin = next(x for x in fin_e if x.request_id == r.request_id)
            assert _request_view(r, lazy) == _request_view(twin, eager)

    for i, (op, plen, olen, group) in enumerate(ops):
        rid = f"r{len(prompts)}"
        resendable = [p for p in prompts if p not in one_offs]
        if op in ("add", "one-off"):
            add(rid, _prompt(rid, max(1, min(plen, limit - olen)), group), olen, op == "one-off")
        elif op == "turn" and resendable:  # resends an answer (done, or still being generated)
            prev = resendable[-1 - group % len(resendable)]  # a recent one
            add(rid, _next_turn(rid, prev, prompts[prev], olen, 1 + plen % 16), olen)
        elif op == "pair":  # a turn that reaches the engine before the one it follows
            first, later = _prompt(rid, plen, group), f"r{len(prompts) + 1}"
            if add(later, _next_turn(later, rid, first, olen, 1 + plen % 7), olen):
                assert add(rid, first, olen)
        elif op == "abort" and eager.requests:
            rid = sorted(eager.requests)[group % len(eager.requests)]
            a = eager.finish_request(rid, RequestStatus.FINISHED_ABORTED)
            b = lazy.finish_request(rid, RequestStatus.FINISHED_ABORTED)
            assert a is not None and b is not None
            assert _request_view(b, lazy) == _request_view(a, eager)
            check_held()
        else:
            step()
        if i % look == look - 1:  # now and then, look at everything (sync is exact between steps,
            lazy.sync()  # and so is caching a private output's blocks at any time)
            for r in lazy.running:
                lazy.kv.cache_computed(r, r.num_computed_tokens)
            assert _state_view(lazy) == _state_view(eager)
            gone = unfindable()
            assert _labels(lazy, gone) == _labels(eager, gone)
            check_fast_invariants(lazy)
    for _ in range(100000):
        if not eager.has_unfinished:
            break
        step()
    assert not lazy.has_unfinished
    assert lazy.step_index == eager.step_index
    gone = unfindable()
    assert _labels(lazy, gone) == _labels(eager, gone)
