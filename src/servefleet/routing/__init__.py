"""Routing policies: pure functions of (replica views, request context)."""

from __future__ import annotations

from servefleet.routing.base import ReplicaView, RequestContext, RoutingPolicy, stable_hash
from servefleet.routing.consistent_hash import ConsistentHash
from servefleet.routing.simple import LeastOutstanding, PowerOfTwo, RoundRobin

POLICIES = {
    "round-robin": RoundRobin,
    "least-outstanding": LeastOutstanding,
    "least-outstanding-tokens": lambda: LeastOutstanding(by="tokens"),
    "power-of-two": PowerOfTwo,
    "session-hash": ConsistentHash,
}


def make_policy(name: str) -> RoutingPolicy:
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(
            f"unknown routing policy {name!r}; choose one of {', '.join(POLICIES)}"
        ) from None
    return factory()


__all__ = [
    "POLICIES",
    "ConsistentHash",
    "LeastOutstanding",
    "PowerOfTwo",
    "ReplicaView",
    "RequestContext",
    "RoundRobin",
    "RoutingPolicy",
    "make_policy",
    "stable_hash",
]
