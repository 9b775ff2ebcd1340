"""Routing policies as pure functions of replica views (no sockets, no clock)."""

from __future__ import annotations

import pytest

from servefleet.routing import (
    ConsistentHash,
    LeastOutstanding,
    PowerOfTwo,
    ReplicaView,
    RequestContext,
    RoundRobin,
    make_policy,
)


def views(*loads: int, ready: tuple[bool, ...] | None = None) -> list[ReplicaView]:
    ready = ready or (True,) * len(loads)
    return [
        ReplicaView(f"r{i}", in_flight=n, ready=ok)
        for i, (n, ok) in enumerate(zip(loads, ready, strict=True))
    ]


def ctx(key: str | None = None) -> RequestContext:
    return RequestContext("x", 100, 10, session_key=key)


def test_round_robin_cycles_and_skips_unready():
    rr = RoundRobin()
    vs = views(0, 0, 0, ready=(True, False, True))
    assert [rr.select(vs, ctx()).replica.name for _ in range(4)] == ["r0", "r2", "r0", "r2"]
    assert rr.select(views(0, ready=(False,)), ctx()) is None


def test_least_outstanding_by_requests_and_tokens():
    vs = views(3, 1, 2)
    vs[1].in_flight_tokens = 10_000
    assert LeastOutstanding().select(vs, ctx()).replica.name == "r1"
    assert (
        LeastOutstanding(by="tokens").select(vs, ctx()).replica.name == "r2"
    )  # 0 tokens, fewer requests
    capped = views(0, 5)
    capped[0].max_in_flight = 0
    assert LeastOutstanding().select(capped, ctx()).replica.name == "r1"


def test_power_of_two_never_picks_the_most_loaded_of_two():
    p2 = PowerOfTwo(seed=1)
    picks = {p2.select(views(9, 0), ctx()).replica.name for _ in range(50)}
    assert picks == {"r1"}


def test_consistent_hash_is_sticky_and_bounded():
    ch = ConsistentHash(load_factor=1.25)
    vs = views(0, 0, 0, 0)
    home = ch.select(vs, ctx("alice")).replica.name
    assert all(ch.select(vs, ctx("alice")).replica.name == home for _ in range(5))
    # load the home replica past ceil(1.25 * (total + 1) / 4): the key passes on along the ring
    for v in vs:
        v.in_flight = 10 if v.name == home else 2
    moved = ch.select(vs, ctx("alice")).replica.name
    assert moved != home
    cap = -(-1.25 * (sum(v.in_flight for v in vs) + 1) // 4)
    assert next(v for v in vs if v.name == moved).in_flight + 1 <= cap


def test_adding_a_replica_moves_only_its_share_of_keys():
    ch = ConsistentHash()
    keys = [f"user-{i}" for i in range(4000)]
    before = {k: ch.home([f"r{i}" for i in range(4)], k) for k in keys}
    after = {k: ch.home([f"r{i}" for i in range(5)], k) for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert all(after[k] == "r4" for k in moved)  # keys only move to the new replica
    assert 0.12 < len(moved) / len(keys) < 0.28  # about 1/5 of them


def test_unknown_policy_names_the_choices():
    with pytest.raises(ValueError, match="round-robin"):
        make_policy("random-walk")
