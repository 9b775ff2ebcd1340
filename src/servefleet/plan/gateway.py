"""The gateway in front of the replicas: which routing policy, and how many requests a replica
may hold before the gateway stops sending it more (admission)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .profile import WorkloadProfile

CAP_ROUND = 4


def default_policy(
    profile: WorkloadProfile, prefix_caching: bool, replicas: int
) -> tuple[str, str]:
    """(policy, reason) before simulation; the search simulates the alternative too."""
    if replicas == 1:
        return "least-outstanding", "one replica: there is nothing to choose"
    if prefix_caching and profile.has_sessions:
        return "session-hash", (
            "the workload has multi-turn sessions and prefix caching is on: consistent hashing "
            "with bounded loads sends a session's turns to the replica that caches its history"
        )
    return "least-outstanding", (
        "requests go to the replica with the fewest in flight (no session affinity to keep)"
    )


def alternative_policy(policy: str) -> str:
    return "least-outstanding" if policy == "session-hash" else "session-hash"


LONG_PROMPT = 1500
"""Prompt tokens above which the gateway's ``length-pools`` sends a request to the long pool
(its default threshold; the field split its pools at about this length)."""


def long_prompts(profile: WorkloadProfile) -> tuple[float, float]:
    """(share of requests, share of prompt tokens) with prompts over ``LONG_PROMPT``."""
    long = profile.prompts > LONG_PROMPT
    return float(long.mean()), float(profile.prompts[long].sum() / profile.prompts.sum())


@dataclass(frozen=True, slots=True)
class PoolSplit:
    """A long-prompt pool: ``long_replicas`` of the replicas (the last ones, ``pool: long`` in
    fleet.yaml) take the prompts over ``LONG_PROMPT`` tokens, routed by ``policy``."""

    policy: str
    long_replicas: int
    reason: str


def pool_split(profile: WorkloadProfile, replicas: int, base: str) -> PoolSplit | None:
    """Rule: when the workload has a long class (1-60 % of requests with prompts over
    ``LONG_PROMPT`` tokens), give them their own replicas — as many as their share of prompt
    tokens, at least one, never all — so that a long prefill never sits in front of short ones
    (``routing.pools.LengthPools`` with named pools); with session affinity, the short pool
    keeps it (``length-pools-prefix``)."""
    share, tokens = long_prompts(profile)
    if replicas < 2 or not 0.01 <= share <= 0.6:
        return None
    n = min(replicas - 1, max(1, round(replicas * tokens)))
    policy = "length-pools-prefix" if base == "session-hash" else "length-pools"
    return PoolSplit(
        policy,
        n,
        f"{share:.0%} of requests ({tokens:.0%} of prompt tokens) have prompts over "
        f"{LONG_PROMPT:,} tokens: {n} of the {replicas} replicas take them (their share of "
        f"prompt tokens; the gateway's {policy} with `pool: long` replicas), so that their "
        "prefills never hold up short requests",
    )


@dataclass(frozen=True, slots=True)
class GatewayChoice:
    policy: str
    policy_reason: str
    max_in_flight_per_replica: int
    cap_reason: str

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}


def choose_cap(max_seen: int, rate: float, replicas: int) -> tuple[int, str]:
    """The admission cap: the most requests one replica held at the planned rate, rounded up;
    at that rate no request is refused, above it the excess waits at the gateway (or gets a
    429) instead of queueing inside vLLM past the TTFT SLO."""
    cap = max(CAP_ROUND, math.ceil(max_seen / CAP_ROUND) * CAP_ROUND)
    return cap, (
        f"at {rate:g} req/s the most requests in flight on one of the {replicas} replica(s) was "
        f"{max_seen}; rounded up to a multiple of {CAP_ROUND}: {cap}. At the planned rate no "
        "request is refused; above it, the excess waits at the gateway (or gets HTTP 429) "
        "instead of queueing inside vLLM"
    )
