"""The prefix cache's counters count where vLLM 0.26 counts (engine/kv_cache_manager.py,
``PrefixCacheStats``): ``queries``/``hits`` at every lookup of a waiting request — a queue head
blocked for blocks is looked up again at each step, as vLLM's scheduler calls
``get_computed_blocks`` at each attempt — with re-admissions after a preemption apart; and
``prompt_tokens``/``cached_tokens`` once per request, at its first admission (the rate the
requests saw). Hand-computed, with the plain rule's scheduler (which tries a blocked head at
every step) and the fast path's (which skips it while nothing changed: the skip must count what
a lookup would have found), checked against each other."""

from __future__ import annotations

from engine_helpers import make_request
from servefleet.engine.config import SchedulerConfig
from servefleet.engine.scheduler import Scheduler
from servefleet.fastpath.scheduler import Scheduler as FastScheduler


def _pair(**kw) -> tuple[Scheduler, FastScheduler]:
    cfg = SchedulerConfig(
        num_gpu_blocks=kw.pop("num_gpu_blocks"),
        max_num_seqs=256,
        max_num_batched_tokens=1024,
        max_model_len=8192,
        async_scheduling=False,
        **kw,
    )
    return Scheduler(cfg), FastScheduler(cfg)


def _add(scheds: tuple, rid: str, prompt: int, out: int, prefix=None) -> None:
    for s in scheds:
        fast = isinstance(s, FastScheduler)
        s.add_request(make_request(rid, prompt, out, prefix=prefix, fast=fast))


def _step(scheds: tuple) -> None:
    for s in scheds:
        out = s.schedule()
        s.update_from_output(out, s.step_index - 1)
    assert scheds[0].kv.stats == scheds[1].kv.stats


def test_blocked_head_is_counted_at_every_attempt_with_the_hits_each_lookup_finds():
    # 10 blocks of 16 tokens. 'a' leaves the two blocks of prefix P cached (idle, evicted
    # last); 'b' (96 tokens, 6 blocks) then decodes 40 tokens, taking the 4 free blocks one by
    # one; 'c' (P + 48 tokens: 5 blocks, 2 of them hits) needs 3 new blocks where only 2 are
    # free besides its hits: blocked until 'b' finishes.
    s = _pair(num_gpu_blocks=10)
    _add(s, "a", 32, 1, prefix=("P", 32))
    _step(s)  # a: prefilled, sampled its one token, finished: blocks 0, 1 cached and idle
    _add(s, "b", 96, 40)
    _add(s, "c", 80, 2, prefix=("P", 32))
    for _ in range(40):  # steps 2..41: b prefills and decodes, finishing at step 41
        _step(s)
        assert "c" in [r.request_id for r in s[1].waiting]
    # b's token 129 (step 35) took the 4th free block, evicting block 1 (P's second block):
    # c's lookups found 32 tokens at steps 2..34, 16 at steps 35..41.
    _step(s)  # step 42: b's blocks are free, c gets in with 16 tokens found
    st = s[1].kv.stats
    assert s[1].requests["c"].num_cached_tokens == 16
    assert st.requests == 1 + 1 + 41  # a, b once; c at each of steps 2..42
    assert st.queries == 32 + 96 + 41 * 80
    assert st.hits == 33 * 32 + 8 * 16
    assert (st.prompt_tokens, st.cached_tokens) == (32 + 96 + 80, 16)
    assert st.preempted_requests == st.preempted_queries == st.preempted_hits == 0


def test_readmission_after_preemption_is_counted_apart():
    # 10 blocks of 16 tokens. 'old' (64 + 30 tokens) and 'new' (64 + 60) prefill at step 1 and
    # fill 5 blocks each by token 80; at step 18 'old' computes its token 81, needs a 6th block
    # and preempts 'new' (81 tokens, 5 full blocks cached when freed; 'old' takes the freed tail
    # block, so 4 blocks = 64 tokens stay). 'new' is looked up at steps 19..30 in vain, and at
    # step 31, after 'old' sampled its 30th token at step 30, gets in.
    s = _pair(num_gpu_blocks=10)
    _add(s, "old", 64, 30)
    _add(s, "new", 64, 60)
    while s[1].has_unfinished:
        _step(s)
    st = s[1].kv.stats
    assert (st.requests, st.queries, st.hits) == (2, 128, 0)  # each admitted at its first try
    assert (st.prompt_tokens, st.cached_tokens) == (128, 0)  # each request once
    assert st.preempted_requests == 13
    assert (st.preempted_queries, st.preempted_hits) == (13 * 81, 13 * 64)


def test_no_counts_without_prefix_caching():
    s = _pair(num_gpu_blocks=10, enable_prefix_caching=False)
    _add(s, "a", 64, 4)
    while s[1].has_unfinished:
        _step(s)
    assert s[1].kv.stats.queries == s[1].kv.stats.prompt_tokens == 0
