"""The kept-index answers of predicted-latency and length-pools (TtftSearch, pool subsets)
against the plain scans, with real cost models, pending prefills and changing pools."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servefleet.routing import LoadIndex, ReplicaView, RequestContext, make_policy, predicted
from servefleet.routing.predicted import cost_model_for, predict_ttft, ttft_lower_bound
from servefleet.routing.prefix import chain_hashes

N = 7


@pytest.fixture(autouse=True, scope="module")
def search_small_fleets():
    """Search even these small fleets (the policy scans below SEARCH_MIN_REPLICAS)."""
    saved, predicted.SEARCH_MIN_REPLICAS = predicted.SEARCH_MIN_REPLICAS, 0
    yield
    predicted.SEARCH_MIN_REPLICAS = saved


COSTS = {}


def cost(name: str):
    if name not in COSTS:
        COSTS[name] = cost_model_for(*name.split("@"))
    return COSTS[name]


def fleet(kinds: int) -> list[ReplicaView]:
    """Replicas of up to ``kinds`` kinds (cost model, budget, scale); one without a model."""
    out = []
    for i in range(N):
        k = i % kinds
        out.append(
            ReplicaView(
                f"r{i}",
                cost=None if k == 2 else cost("Qwen2.5-7B@H200-SXM"),
                max_num_batched_tokens=2048 if k == 1 else 8192,
                max_num_seqs=4 if k == 1 else 256,
                latency_scale=1.5 if k == 1 else 1.0,
            )
        )
    return out


def apply(v: ReplicaView, op: str, k: int) -> None:
    """Load changes as the simulator makes them: routed (pending), first token, finished."""
    if op == "route":
        v.in_flight += 1
        v.in_flight_tokens += 900 * k + 30
        v.pending_prefills += 1
        v.pending_prefill_tokens += 700 * k + 20
    elif op == "first" and v.pending_prefills:
        v.pending_prefill_tokens -= v.pending_prefill_tokens // v.pending_prefills
        v.pending_prefills -= 1
    elif op == "finish" and v.in_flight > v.pending_prefills:
        v.in_flight -= 1
        v.in_flight_tokens = max(v.in_flight, v.in_flight_tokens - 900 * k - 30)
    elif op == "ready":
        v.ready = k != 0
    elif op == "cap":
        v.max_in_flight = None if k == 0 else 2 * k


ops = st.lists(
    st.tuples(
        st.integers(0, N - 1),
        st.sampled_from(["route", "route", "first", "finish", "ready", "cap"]),
        st.integers(0, 12),
    ),
    max_size=80,
)

POLICY_OPTIONS = [
    ("predicted-latency", {}),
    ("length-pools", {}),
    ("length-pools-prefix", {}),
    ("length-pools", {"long": "predicted-latency", "default": "predicted-latency"}),
    ("length-pools", {"default": "prefix-affinity", "threshold": 3000}),
]


@settings(max_examples=120, deadline=None)
@given(ops, st.integers(1, 3), st.sampled_from(range(len(POLICY_OPTIONS))))
def test_kept_index_picks_what_the_scan_picks(steps, kinds, which):
    name, options = POLICY_OPTIONS[which]
    views = fleet(kinds)
    idx = LoadIndex(views, tracks_prefills=True)
    kept, plain = make_policy(name, **options), make_policy(name, **options)
    for n, (i, op, k) in enumerate(steps):
        apply(views[i], op, k)
        idx.update(views[i])
        hashes = chain_hashes(bytes([k % 3, j]) for j in range(k % 4 + 1))
        ctx = RequestContext(f"q{n}", 350 * k + 1, 10, f"s{k}", hashes)
        a, b = kept.select(idx, ctx), plain.select(list(views), ctx)
        assert a == b
        if a is not None:
            kept.on_routed(a.replica, ctx)
            plain.on_routed(b.replica, ctx)


def test_many_replicas_with_equal_and_distinct_states():
    """A bigger fleet, many requests: idle replicas (one shared state) and loaded ones."""
    rng = random.Random(3)
    views = [ReplicaView(f"r{i}", cost=cost("Qwen2.5-7B@H200-SXM")) for i in range(64)]
    idx = LoadIndex(views, tracks_prefills=True)
    kept, plain = make_policy("predicted-latency"), make_policy("predicted-latency")
    for n in range(600):
        v = rng.choice(views)
        apply(v, rng.choice(["route", "first", "first", "finish", "finish"]), rng.randrange(8))
        idx.update(v)
        ctx = RequestContext(f"q{n}", rng.randrange(1, 9000), 10)
        a, b = kept.select(idx, ctx), plain.select(views, ctx)
        assert a == b


@pytest.mark.parametrize("gpu", ["H200-SXM", "A100-80G-SXM", "V100-SXM2-32G"])
def test_the_bound_is_below_the_prediction_and_monotone(gpu):
    """What the search rests on: for random states, the bound at the state is at most the
    prediction, and raising any of W, D, hc never lowers it."""
    rng = random.Random(gpu)
    model = cost(f"Qwen2.5-7B@{gpu}")
    for _ in range(400):
        b, s = rng.choice([(8192, 256), (2048, 64), (512, 256), (16384, 1024)])
        pending = rng.randrange(0, 5)
        inf = pending + rng.randrange(0, 2 * s)
        r = ReplicaView(
            "r",
            in_flight=inf,
            in_flight_tokens=inf * rng.randrange(1, 4000),
            pending_prefills=pending,
            pending_prefill_tokens=pending * rng.randrange(1, 5000),
            cost=model,
            max_num_batched_tokens=b,
            max_num_seqs=s,
        )
        p = rng.randrange(1, 20000)
        w, d = r.pending_prefill_tokens, max(0, min(inf - pending, s))
        h = (r.in_flight_tokens // inf) // 2 if inf else 0
        lb = ttft_lower_bound(r, w, d, h, p)
        assert lb <= predict_ttft(r, p, 0) * (1 + 1e-12)
        for dw, dd, dh in [(rng.randrange(1, 3000), 0, 0), (0, rng.randrange(1, 40), 0)]:
            assert ttft_lower_bound(r, w + dw, d + dd, h + dh, p) >= lb
        assert ttft_lower_bound(r, w, d, h + rng.randrange(1, 3000), p) >= lb
