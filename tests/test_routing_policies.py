"""Prefix affinity, length pools and predicted latency: pure objects, no sockets, no clock;
and every policy runs in the simulator."""

from __future__ import annotations

import pytest

from servefleet.hardware import get_gpu
from servefleet.models import load_model
from servefleet.routing import (
    POLICIES,
    LengthPools,
    PredictedLatency,
    PrefixAffinity,
    PrefixIndex,
    ReplicaView,
    RequestContext,
    cost_model_for,
    make_policy,
    predict_ttft,
    segment_prefix_hashes,
    text_prefix_hashes,
)
from servefleet.routing.prefix import PREFIX_CHUNK_CHARS
from servefleet.sim.cluster import ClusterSim
from servefleet.sim.deployment import resolve_deployment
from servefleet.sim.runner import Load, build_replicas, simulate_point
from servefleet.workload import Segment, build_source, fixed_workload, load_workload


def views(*loads: int) -> list[ReplicaView]:
    return [ReplicaView(f"r{i}", in_flight=n) for i, n in enumerate(loads)]


def ctx(hashes=(), prompt=1000, rid="x") -> RequestContext:
    return RequestContext(rid, prompt, 10, None, tuple(hashes))


def test_chained_hashes_share_exactly_the_common_full_chunks():
    a = "s" * PREFIX_CHUNK_CHARS * 3 + "tail a"
    b = "s" * PREFIX_CHUNK_CHARS * 2 + "t" * PREFIX_CHUNK_CHARS
    ha, hb = text_prefix_hashes(a), text_prefix_hashes(b)
    assert len(ha) == 3 and len(hb) == 3  # only full chunks
    assert ha[:2] == hb[:2] and ha[2] != hb[2]
    assert text_prefix_hashes("short") == ()
    # the simulator's chunks: same keys, same hashes; a different first segment changes all
    sys = Segment("system-1", 200, "system")
    s1 = segment_prefix_hashes((sys, Segment("u1", 100)), "r1")
    s2 = segment_prefix_hashes((sys, Segment("u2", 100)), "r2")
    assert s1[:3] == s2[:3] and s1[3] != s2[3]
    assert segment_prefix_hashes((Segment("other", 200), Segment("u1", 100)), "r1")[0] != s1[0]


def test_prefix_index_is_lru_bounded_and_evicts_deep_chunks_first():
    idx = PrefixIndex(capacity=4)
    idx.record("r0", [1, 2, 3])
    idx.record("r1", [1, 9])
    assert len(idx) == 4
    assert idx.match([1, 2, 3], ["r0", "r1"]) == {"r0": 3, "r1": 1}
    idx.record("r2", [7, 8])  # evicts the least recently used: the deep chunks of r0's chain
    assert len(idx) == 4
    assert idx.match([1, 2, 3], ["r0", "r1", "r2"]).get("r0", 0) < 3
    assert idx.match([1, 9], ["r1"]) == {"r1": 2}
    idx.forget("r1")
    assert idx.match([1, 9], ["r1"]) == {}


def test_prefix_affinity_takes_the_longest_match_unless_overloaded():
    p = PrefixAffinity(load_factor=1.25)
    vs = views(0, 0, 0)
    p.on_routed(vs[1], ctx([1, 2, 3]))
    p.on_routed(vs[2], ctx([1, 2]))
    sel = p.select(vs, ctx([1, 2, 3, 4]))
    assert sel.replica.name == "r1"
    assert sel.decision == "affinity" and sel.expected_hit_tokens == 3 * p.chunk_tokens
    vs[1].in_flight = 10  # above ceil(1.25 * 11 / 3) = 5: the next-longest match within the bound
    assert p.select(vs, ctx([1, 2, 3, 4])).replica.name == "r2"
    vs[2].in_flight = 10
    sel = p.select(vs, ctx([1, 2, 3, 4]))
    assert sel.replica.name == "r0" and sel.decision == "overloaded"
    sel = p.select(views(3, 1, 2), ctx([42]))
    assert sel.replica.name == "r1" and sel.decision == "miss"  # no match: least outstanding


def test_length_pools_keep_long_prompts_apart():
    lp = LengthPools(threshold=1500, long_fraction=0.25)
    vs = views(0, 0, 0, 0)  # no replica says pool=long: the last quarter (r3) is the long pool
    assert {lp.select(vs, ctx(prompt=3000)).replica.name for _ in range(5)} == {"r3"}
    sel = lp.select(vs, ctx(prompt=100))
    assert sel.replica.name in {"r0", "r1", "r2"} and sel.decision == "default:least-outstanding"
    # by default the long pool is sized by the long prompts' share of prompt tokens
    auto = LengthPools(threshold=1500)
    for i in range(200):
        auto.select(vs, ctx(prompt=3000, rid=f"l{i}"))
        for j in range(3):
            auto.select(vs, ctx(prompt=1000, rid=f"s{i}.{j}"))
    assert auto.long_names(vs) == {"r2", "r3"}  # half of the tokens are in long prompts
    named = [ReplicaView("a", pool="long"), ReplicaView("b"), ReplicaView("c", pool="long")]
    assert lp.select(named, ctx(prompt=3000)).replica.name in {"a", "c"}
    assert lp.select(named, ctx(prompt=10)).replica.name == "b"
    named[1].ready = False  # the default pool is down: spill to the long pool
    sel = lp.select(named, ctx(prompt=10))
    assert sel.replica.name in {"a", "c"} and sel.decision == "default:spilled"
    assert LengthPools(spill=False).select(named, ctx(prompt=10)) is None
    with pytest.raises(ValueError, match="long_fraction"):
        LengthPools(long_fraction=1.0)
    with pytest.raises(ValueError, match="threshold"):
        LengthPools(threshold=0)


def test_predicted_latency_trades_cache_hits_against_queues():
    cost = cost_model_for("Qwen2.5-7B", "H200-SXM")
    vs = [ReplicaView(f"r{i}", cost=cost) for i in range(3)]
    p = PredictedLatency()
    prompt = 2048
    hashes = list(range(prompt // 64))
    p.on_routed(vs[2], ctx(hashes, prompt))
    sel = p.select(vs, ctx(hashes, prompt))
    assert sel.replica.name == "r2"  # the cached replica saves the prefill
    assert sel.decision == "affinity" and sel.expected_hit_tokens == prompt - 1
    assert sel.predicted_ttft == predict_ttft(vs[2], prompt, prompt - 1)
    # a long prefill queue on the cached replica costs more than the prefill it saves
    vs[2].pending_prefill_tokens, vs[2].pending_prefills, vs[2].in_flight = 60_000, 20, 20
    assert p.select(vs, ctx(hashes, prompt)).replica.name != "r2"
    # more queued work predicts a later first token; a slower replica (learned scale) too
    idle, busy = (
        ReplicaView("i", cost=cost),
        ReplicaView("b", cost=cost, in_flight=50, in_flight_tokens=50_000),
    )
    assert predict_ttft(busy, 500, 0) > predict_ttft(idle, 500, 0)
    slow = ReplicaView("s", cost=cost, latency_scale=3.0)
    assert predict_ttft(slow, 500, 0) == pytest.approx(3 * predict_ttft(idle, 500, 0))
    # without a cost model it still orders by work
    assert predict_ttft(ReplicaView("n", pending_prefill_tokens=5000), 10, 0) > predict_ttft(
        ReplicaView("m"), 10, 0
    )


def test_policies_declare_the_context_they_need():
    from servefleet.routing import PENDING_PREFILLS, PREFIX_HASHES

    assert make_policy("prefix-affinity").needs == {PREFIX_HASHES}
    assert make_policy("predicted-latency").needs == {PREFIX_HASHES, PENDING_PREFILLS}
    for name in ("round-robin", "least-outstanding", "power-of-two", "session-hash"):
        assert make_policy(name).needs == frozenset(), name
    assert make_policy("length-pools").needs == frozenset()
    assert make_policy("length-pools", default="prefix-affinity").needs == {PREFIX_HASHES}


def test_make_policy_passes_options_and_names_bad_ones():
    assert make_policy("prefix-affinity", load_factor=2.0).load_factor == 2.0
    lp = make_policy("length-pools", threshold=100, default="prefix-affinity")
    assert isinstance(lp.default_policy, PrefixAffinity) and lp.threshold == 100
    with pytest.raises(ValueError, match="bad options"):
        make_policy("round-robin", nonsense=1)


def test_predicted_latency_searches_in_the_simulator_with_the_scans_choices():
    """Past 32 replicas the simulator's kept index (told of first tokens, because the policy
    needs PENDING_PREFILLS) lets predicted-latency search instead of scanning every replica;
    the run is the same as with the scan (the same policy, not told of first tokens)."""
    from servefleet.routing import PENDING_PREFILLS, PredictedLatency

    class Scanning(PredictedLatency):
        needs = PredictedLatency.needs - {PENDING_PREFILLS}

    dep = resolve_deployment(load_model("Qwen2.5-7B"), get_gpu("H200-SXM"), replicas=40)
    runs = []
    for policy in (make_policy("predicted-latency"), Scanning()):
        source = build_source(fixed_workload(600, 50, rate=400.0), seed=1, rate=400.0)
        res = ClusterSim(build_replicas(dep), policy, source).run(3.0)
        runs.append(
            [(r.request_id, r.replica, r.first_token_time, r.end_time) for r in res.records]
        )
    assert len(runs[0]) > 1000 and len({r[1] for r in runs[0]}) == 40
    assert runs[0] == runs[1]


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_runs_in_the_simulator(name):
    dep = resolve_deployment(load_model("Qwen2.5-7B"), get_gpu("H200-SXM"), replicas=3)
    replicas = build_replicas(dep)
    source = build_source(fixed_workload(600, 50, rate=10.0), seed=0, rate=10.0)
    res = ClusterSim(replicas, make_policy(name), source).run(12.0)
    assert len(res.records) > 50 and all(r.ok for r in res.records)
    for r in replicas:  # the views are back to idle once everything finished
        v = r.view
        assert (v.in_flight, v.in_flight_tokens, v.pending_prefills, v.pending_prefill_tokens) == (
            0,
            0,
            0,
            0,
        )


def test_prefix_affinity_raises_the_hit_rate_of_sessions_in_simulation():
    dep = resolve_deployment(load_model("Qwen2.5-7B"), get_gpu("H200-SXM"), replicas=4)
    wl = load_workload("enterprise-mix")
    kw = dict(duration=90.0, warmup=20.0)
    rr = simulate_point(dep, wl, Load(rate=8.0), policy="round-robin", **kw)
    pa = simulate_point(dep, wl, Load(rate=8.0), policy="prefix-affinity", **kw)
    assert pa.prefix_hit_rate > rr.prefix_hit_rate * 1.5


def test_length_pools_count_a_request_once_in_the_token_share():
    """A request selected again (a retry, a wait for capacity) is one request of the mix: a
    short prompt retried many times does not shrink the long pool."""
    vs = views(0, 0, 0, 0)
    once, retried = LengthPools(threshold=1500), LengthPools(threshold=1500)
    for i in range(300):
        for lp in (once, retried):
            lp.select(vs, ctx(prompt=3000, rid=f"l{i}"))
            for j in range(3):
                lp.select(vs, ctx(prompt=1000, rid=f"s{i}.{j}"))
        for _ in range(5):
            retried.select(vs, ctx(prompt=1000, rid=f"s{i}.0"))
    assert once.long_names(vs) == retried.long_names(vs) == {"r2", "r3"}
