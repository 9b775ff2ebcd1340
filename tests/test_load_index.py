"""LoadIndex (a maintained index of replica views) against the plain scans it replaces."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from servefleet.routing import POLICIES, LoadIndex, ReplicaView, RequestContext, make_policy
from servefleet.routing.load_index import _key
from servefleet.routing.prefix import chain_hashes

N = 6
ops = st.lists(
    st.tuples(
        st.integers(0, N - 1),
        st.sampled_from(["arrive", "finish", "ready", "cap"]),
        st.integers(0, 3),
    ),
    max_size=60,
)


def fleet() -> list[ReplicaView]:
    return [ReplicaView(f"r{i}", pool="long" if i == N - 1 else "default") for i in range(N)]


def apply(v: ReplicaView, op: str, k: int) -> None:
    if op == "arrive":
        v.in_flight += 1
        v.in_flight_tokens += 100 * k + 1
    elif op == "finish" and v.in_flight:
        v.in_flight -= 1
        v.in_flight_tokens = max(0, v.in_flight_tokens - 100 * k - 1)
    elif op == "ready":
        v.ready = k != 0
    elif op == "cap":
        v.max_in_flight = None if k == 0 else k


@settings(max_examples=150, deadline=None)
@given(ops)
def test_answers_equal_the_scans(steps):
    views = fleet()
    idx = LoadIndex(views)
    for i, op, k in steps:
        apply(views[i], op, k)
        idx.update(views[i])
        avail = [v for v in views if v.available]
        assert list(idx.available()) == avail
        assert [v.name in idx.available_names for v in views] == [v.available for v in views]
        assert idx.total_in_flight == sum(v.in_flight for v in views)
        by_req = min(avail, key=lambda v: (v.in_flight, v.in_flight_tokens), default=None)
        by_tok = min(avail, key=lambda v: (v.in_flight_tokens, v.in_flight), default=None)
        assert idx.least("requests") is by_req
        assert idx.least("tokens") is by_tok


@settings(max_examples=150, deadline=None)
@given(ops, st.sets(st.integers(0, N - 1)), st.lists(st.integers(0, N - 1), max_size=60))
def test_a_subset_answers_equal_the_scans_of_its_members(steps, start, moves):
    """A subset updated through its parent, replicas moving in and out of it (what
    length-pools does when its long pool grows or shrinks): the scans of its members."""
    views = fleet()
    idx = LoadIndex(views)
    sub = idx.subset(start)
    inside = [i in start for i in range(N)]
    for n, (i, op, k) in enumerate(steps):
        apply(views[i], op, k)
        idx.update(views[i])
        if n < len(moves):
            j = moves[n]
            inside[j] = not inside[j]
            sub.set_member(j, inside[j])
        members = [v for v, m in zip(views, inside, strict=True) if m]
        avail = [v for v in members if v.available]
        assert list(sub) == members
        assert list(sub.available()) == avail
        assert sub.has_available() == bool(avail)
        assert sub.total_in_flight == sum(v.in_flight for v in members)
        by_req = min(avail, key=lambda v: (v.in_flight, v.in_flight_tokens), default=None)
        assert sub.least("requests") is by_req


@settings(max_examples=60, deadline=None)
@given(ops, st.sampled_from(sorted(POLICIES)))
def test_every_policy_picks_the_same_with_a_kept_index_as_with_a_list(steps, name):
    """The simulator keeps one index across requests; the gateway passes a fresh list."""
    views = fleet()
    idx = LoadIndex(views)
    kept, plain = make_policy(name), make_policy(name)
    for n, (i, op, k) in enumerate(steps):
        apply(views[i], op, k)
        idx.update(views[i])
        hashes = chain_hashes(bytes([k, j]) for j in range(k + 1))
        ctx = RequestContext(f"q{n}", 400 * k + 10, 10, f"s{k}", hashes)
        a, b = kept.select(idx, ctx), plain.select(list(views), ctx)
        assert (a is None) == (b is None)
        if a is not None:
            assert a == b
            kept.on_routed(a.replica, ctx)
            plain.on_routed(b.replica, ctx)


loads = st.tuples(st.integers(-(2**40), 2**40), st.integers(-(2**40), 2**40))


@settings(max_examples=200, deadline=None)
@given(st.lists(loads, min_size=1, max_size=40), st.sampled_from(["requests", "tokens"]))
def test_packed_keys_order_as_the_tuples_they_pack(pairs: list[tuple[int, int]], by) -> None:
    """``least``'s heap holds each view's load and position packed into one int: ordered as
    the tuple (in_flight, in_flight_tokens, position) (tokens first by tokens), negative
    loads included, and the position read back from it."""
    views = [ReplicaView(f"r{i}") for i in range(len(pairs))]
    for v, (requests, tokens) in zip(views, pairs, strict=True):
        v.in_flight, v.in_flight_tokens = requests, tokens
    bits = len(views).bit_length()
    keys = [_key(by, v, i, bits) for i, v in enumerate(views)]

    def plain(i: int) -> tuple[int, int, int]:
        v = views[i]
        first, second = (
            (v.in_flight, v.in_flight_tokens)
            if by == "requests"
            else (v.in_flight_tokens, v.in_flight)
        )
        return first, second, i

    assert sorted(range(len(views)), key=keys.__getitem__) == sorted(range(len(views)), key=plain)
    assert [k & ((1 << bits) - 1) for k in keys] == list(range(len(views)))
