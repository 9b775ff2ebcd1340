"""Who may share content (``fastpath.contract``): the fast path does not cache the blocks of a
request's own content, so a workload that resends such content must fail loudly, and one that
writes its own keys must get the plain rule's prefix hits, never silently lose them."""

from __future__ import annotations

import dataclasses

import pytest

from servefleet.fastpath import ContentContractError, OwnContent
from servefleet.hardware import get_gpu
from servefleet.models import load_model
from servefleet.routing import make_policy
from servefleet.sim.cluster import ClusterSim
from servefleet.sim.deployment import resolve_deployment
from servefleet.sim.runner import build_replicas
from servefleet.tokens import Segment, output_key, user_key
from servefleet.workload.types import RequestSpec


class Listed:
    """A workload source of given requests (a harness or a trace replay)."""

    def __init__(self, specs: list[RequestSpec]) -> None:
        self.specs = specs

    def initial(self):
        return iter(self.specs)

    def on_finish(self, spec, finish_time, output_tokens):
        return []


def _spec(i: int, prompt: tuple[Segment, ...], session: str | None = None) -> RequestSpec:
    return RequestSpec(f"r{i}", "c", prompt, 16, arrival_time=0.5 * i, session_id=session)


def _run(specs: list[RequestSpec], fast: bool) -> dict:
    dep = resolve_deployment(load_model("Qwen2.5-7B"), get_gpu("H200-SXM"), tp=1, num_gpus=1)
    replicas = build_replicas(dep)
    res = ClusterSim(replicas, make_policy("round-robin"), Listed(specs), fast=fast).run(60.0)
    stats = replicas[0].engine.prefix_stats
    return {
        "records": [dataclasses.asdict(r) for r in res.records],
        "prefix": dataclasses.asdict(stats),
    }


def test_a_request_outside_a_session_owns_its_user_message_and_its_output():
    own = OwnContent()
    system = Segment("sys", 100, "system")
    assert own.own_from("a", (system, Segment(user_key("a"), 50)), in_session=False) == 100
    assert own.own_from("b", (system,), in_session=False) == 100  # its output only
    # a session's turns own nothing (later turns resend them)
    assert own.own_from("c", (system, Segment(user_key("c"), 50)), in_session=True) == -1
    # a user message keyed apart from the request's id: it owns nothing, the plain rule holds
    assert own.own_from("d", (system, Segment("prompt-7", 50)), in_session=False) == -1
    for resent in (Segment(user_key("a"), 50), Segment(output_key("b"), 9, "answer")):
        with pytest.raises(ContentContractError, match="outside any session owned"):
            own.own_from("e", (system, resent), in_session=False)
    # what no one owned may be resent by anyone
    assert own.own_from("f", (system, Segment("prompt-7", 50)), in_session=False) == -1
    assert own.own_from("g", (Segment(user_key("c"), 50),), in_session=True) == -1


def test_resending_owned_content_raises_instead_of_losing_prefix_hits():
    """A harness that repeats a prompt under the first request's own key: the fast path would
    have left that request's blocks uncached, so it refuses; the plain rule finds the hits."""
    prompt = (Segment("sys", 64, "system"), Segment(user_key("r0"), 400))
    specs = [_spec(0, prompt), _spec(1, prompt), _spec(2, prompt)]
    plain = _run(specs, fast=False)
    assert plain["prefix"]["cached_tokens"] > 2 * 400
    with pytest.raises(ContentContractError, match="r0"):
        _run(specs, fast=True)


def test_repeated_prompts_keyed_apart_from_their_ids_hit_as_in_the_plain_rule():
    """A trace replay or harness that writes its own keys (repeated prompts, shared blocks, no
    session): every block is cached as the plain rule caches it, the same hits and records."""
    specs = []
    for i in range(12):
        shared = Segment(f"block-{i % 3}", 160, "user")
        specs.append(_spec(i, (Segment("sys", 64, "system"), shared, Segment(f"q{i % 2}", 48))))
    fast, plain = _run(specs, fast=True), _run(specs, fast=False)
    assert plain["prefix"]["cached_tokens"] > 12 * 64
    assert fast == plain


def test_sessions_resend_their_turns_on_the_fast_path_as_in_the_plain_rule():
    system = Segment("sys", 64, "system")
    first = (system, Segment(user_key("r0"), 200))
    second = (*first, Segment(output_key("r0"), 16, "answer"), Segment(user_key("r1"), 30))
    specs = [
        _spec(0, first, "s"),
        _spec(1, second, "s"),
        _spec(2, (system, Segment(user_key("r2"), 90))),
    ]
    specs[1] = dataclasses.replace(specs[1], arrival_time=20.0, turn=1)
    fast, plain = _run(specs, fast=True), _run(specs, fast=False)
    assert fast == plain and plain["prefix"]["cached_tokens"] >= 200
