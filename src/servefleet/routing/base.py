"""What a routing policy sees, and the one signature every policy implements.

A policy is a pure object: it picks one replica from views of the replicas for a request
context, and knows nothing of HTTP, sockets or clocks. The simulator and the gateway build the
views from their own bookkeeping and call the same policy objects.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(slots=True)
class ReplicaView:
    name: str
    pool: str = "default"
    ready: bool = True
    in_flight: int = 0
    """Requests sent to the replica and not finished."""
    in_flight_tokens: int = 0
    """Prompt + requested output tokens of those requests."""
    max_in_flight: int | None = None
    """Per-replica cap (admission); None: no cap."""

    @property
    def available(self) -> bool:
        return self.ready and (self.max_in_flight is None or self.in_flight < self.max_in_flight)


@dataclass(frozen=True, slots=True)
class RequestContext:
    request_id: str
    prompt_tokens: int
    max_tokens: int
    session_key: str | None = None
    """From X-Session-ID, X-User-ID or the body's ``user`` (in that order)."""
    prefix_hashes: tuple[int, ...] = ()
    """Chained hashes of fixed-size chunks of the rendered prompt (prefix-affinity policies)."""


class RoutingPolicy(Protocol):
    name: str

    def select(self, replicas: Sequence[ReplicaView], ctx: RequestContext) -> ReplicaView | None:
        """The replica to send ``ctx`` to, or None when no replica can take it."""
        ...


def available(replicas: Sequence[ReplicaView]) -> list[ReplicaView]:
    return [r for r in replicas if r.available]


def stable_hash(key: str) -> int:
    """A 64-bit hash that is the same in every process (Python's ``hash`` is salted)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")
