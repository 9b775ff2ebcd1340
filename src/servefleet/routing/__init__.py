"""Routing policies: pure objects that turn (replica views, request context) into a
``Selection`` (replica, decision, expected prefix hit, predicted TTFT)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from servefleet.routing.base import (
    PENDING_PREFILLS,
    PREFIX_HASHES,
    ReplicaView,
    RequestContext,
    RoutingPolicy,
    Selection,
    stable_hash,
)
from servefleet.routing.consistent_hash import ConsistentHash
from servefleet.routing.load_index import LoadIndex, bounded_load_cap, load_index
from servefleet.routing.pools import LengthPools
from servefleet.routing.predicted import PredictedLatency, cost_model_for, predict_ttft
from servefleet.routing.prefix import (
    PrefixAffinity,
    PrefixIndex,
    ids_prefix_hashes,
    segment_prefix_hashes,
    text_prefix_hashes,
)
from servefleet.routing.simple import LeastOutstanding, PowerOfTwo, RoundRobin


def _length_pools(
    threshold: int = 1500,
    long: str = "least-outstanding",
    default: str = "least-outstanding",
    long_options: dict | None = None,
    default_options: dict | None = None,
    **kw: Any,
) -> LengthPools:
    return LengthPools(
        threshold,
        make_policy(long, **(long_options or {})),
        make_policy(default, **(default_options or {})),
        **kw,
    )


POLICIES: dict[str, Callable[..., RoutingPolicy]] = {
    "round-robin": RoundRobin,
    "least-outstanding": LeastOutstanding,
    "least-outstanding-tokens": lambda **kw: LeastOutstanding(by="tokens", **kw),
    "power-of-two": PowerOfTwo,
    "session-hash": ConsistentHash,
    "prefix-affinity": PrefixAffinity,
    "length-pools": _length_pools,
    "length-pools-prefix": lambda **kw: _length_pools(
        **({"long": "least-outstanding", "default": "prefix-affinity"} | kw)
    ),
    "predicted-latency": PredictedLatency,
}


def make_policy(name: str, **options: Any) -> RoutingPolicy:
    """A new policy object by name; ``options`` are its constructor's keyword arguments."""
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(
            f"unknown routing policy {name!r}; choose one of {', '.join(POLICIES)}"
        ) from None
    try:
        return factory(**options)
    except TypeError as exc:
        raise ValueError(f"routing policy {name!r}: bad options {options}: {exc}") from None


__all__ = [
    "PENDING_PREFILLS",
    "POLICIES",
    "PREFIX_HASHES",
    "ConsistentHash",
    "LeastOutstanding",
    "LengthPools",
    "LoadIndex",
    "PowerOfTwo",
    "PredictedLatency",
    "PrefixAffinity",
    "PrefixIndex",
    "ReplicaView",
    "RequestContext",
    "RoundRobin",
    "RoutingPolicy",
    "Selection",
    "bounded_load_cap",
    "cost_model_for",
    "ids_prefix_hashes",
    "load_index",
    "make_policy",
    "predict_ttft",
    "segment_prefix_hashes",
    "stable_hash",
    "text_prefix_hashes",
]
