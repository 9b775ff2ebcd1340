"""The scheduler's shortcuts change how much work a step takes, never what it does: lazy
decodes (engine/cruise.py) and skipping a blocked queue head while nothing changed
(``KVCacheManager.still_blocked``). A scheduler with both and one with neither, fed the same
requests, aborts and steps, schedule the same batches, finish the same requests, keep the same
blocks, and end with the same counters."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine_helpers import check_invariants, make_request
from servefleet.engine.config import SchedulerConfig
from servefleet.engine.kv_cache_manager import KVCacheManager
from servefleet.engine.request import Request, RequestStatus
from servefleet.engine.scheduler import Scheduler, SchedulerOutput


class _NeverSkips(KVCacheManager):
    """Tries a blocked queue head again at every step."""

    __slots__ = ()

    def still_blocked(self) -> bool:
        return False


def _ids(reqs: list[Request]) -> list[str]:
    return [r.request_id for r in reqs]


def _step_view(out: SchedulerOutput, finished: list[Request]) -> tuple:
    return (
        _ids(out.reqs),
        out.num_scheduled,
        _ids(out.preempted),
        out.num_tokens,
        out.num_decodes,
        out.decode_context,
        out.prefill_chunks,
        out.num_sampled,
        _ids(out.first_tokens),
        _ids(finished),
    )


def _kv_view(s: Scheduler) -> tuple:
    pool = s.kv.block_pool
    return (s.kv.req_blocks, list(pool.free_queue), pool.cached, pool.ref_cnt, s.kv.stats)


def _request_view(r: Request) -> tuple:
    return (
        r.request_id,
        r.status,
        r.num_computed_tokens,
        r.num_output_tokens,
        r.num_slots,
        r.num_preemptions,
        r.num_recomputed_tokens,
        r.num_cached_tokens,
        r.first_scheduled_step,
        r.token_runs,
    )


def _state_view(s: Scheduler) -> tuple:
    return (
        [_request_view(r) for r in s.running],
        [_request_view(r) for r in s.waiting],
        s.step_index,
    )


def _twin_requests(rid: str, plen: int, olen: int, group: int) -> tuple[Request, Request]:
    def make() -> Request:
        return make_request(rid, plen, olen, prefix=(f"g{group}", min(plen, 48)))

    return make(), make()


@settings(max_examples=80, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["add", "add", "add", "abort", "step", "step", "step", "step", "step"]),
            st.integers(1, 300),
            st.integers(1, 80),
            st.integers(0, 3),
        ),
        min_size=1,
        max_size=150,
    ),
    blocks=st.integers(20, 120),
    budget=st.sampled_from([8, 32, 64, 256, 2048]),
    caching=st.booleans(),
    async_scheduling=st.booleans(),
    block_size=st.sampled_from([1, 4, 16]),
)
def test_shortcuts_schedule_exactly_as_plain_scheduler(
    ops, blocks, budget, caching, async_scheduling, block_size
):
    cfg = SchedulerConfig(
        num_gpu_blocks=blocks,
        max_num_seqs=8,
        max_num_batched_tokens=budget,
        block_size=block_size,
        enable_prefix_caching=caching,
        async_scheduling=async_scheduling,
    )
    eager, lazy = Scheduler(cfg), Scheduler(cfg)
    eager.kv.__class__ = _NeverSkips
    lazy.enable_lazy_decodes()
    n = 0

    def step() -> None:
        out_e, out_l = eager.schedule(), lazy.schedule()
        fin_e = eager.update_from_output(out_e, eager.step_index - 1)
        fin_l = lazy.update_from_output(out_l, lazy.step_index - 1)
        assert _step_view(out_l, fin_l) == _step_view(out_e, fin_e)
        assert _kv_view(lazy) == _kv_view(eager)
        for r in fin_l:  # a finished request is up to date
            twin = next(x for x in fin_e if x.request_id == r.request_id)
            assert _request_view(r) == _request_view(twin)

    for i, (op, plen, olen, group) in enumerate(ops):
        if op == "add":
            plen = min(plen, blocks * block_size - olen - block_size)
            if plen < 1:
                continue
            a, b = _twin_requests(f"r{n}", plen, olen, group)
            n += 1
            eager.add_request(a)
            lazy.add_request(b)
        elif op == "abort" and eager.requests:
            rid = sorted(eager.requests)[group % len(eager.requests)]
            a = eager.finish_request(rid, RequestStatus.FINISHED_ABORTED)
            b = lazy.finish_request(rid, RequestStatus.FINISHED_ABORTED)
            assert a is not None and b is not None
            assert _request_view(b) == _request_view(a)
        else:
            step()
        if i % 11 == 10:  # now and then, look at everything (sync is exact between steps)
            lazy.sync()
            assert _state_view(lazy) == _state_view(eager)
            check_invariants(lazy)
    for _ in range(100000):
        if not eager.has_unfinished:
            break
        step()
    assert not lazy.has_unfinished
    assert lazy.step_index == eager.step_index
