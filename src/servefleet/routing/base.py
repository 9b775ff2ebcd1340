"""What a routing policy sees, and the one signature every policy implements.

A policy is a pure object: it picks one replica from views of the replicas for a request
context, and knows nothing of HTTP, sockets or clocks. The simulator and the gateway build the
views from their own bookkeeping and call the same policy objects.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from servefleet.engine.cost_model import CostModel


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
    # -- optional, for the policies that model the replica (predicted latency) -------------
    pending_prefill_tokens: int = 0
    """Prompt tokens of in-flight requests that have not produced their first token yet."""
    pending_prefills: int = 0
    """How many in-flight requests have not produced their first token yet."""
    cost: CostModel | None = None
    """The engine cost model of this replica's model, GPU and TP (None: unknown)."""
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    latency_scale: float = 1.0
    """Observed ÷ predicted TTFT, learned online by the caller (1.0: the model is right)."""

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


@dataclass(frozen=True, slots=True)
class Selection:
    """A policy's answer: where a request goes, and why."""

    replica: ReplicaView
    decision: str
    """Why, as a metrics label (``affinity``, ``miss``, ``overloaded``, ``load``,
    ``long:least-outstanding``, or the policy's name)."""
    expected_hit_tokens: int = 0
    """Prompt tokens the policy expects the replica's prefix cache to hold."""
    predicted_ttft: float | None = None
    """Seconds to the first token the policy predicts there, with the replica's learned
    latency scale applied (None: the policy predicts nothing)."""


class ReplicaViews(Protocol):
    """What a policy picks from: the views in order, as a list (the gateway) or a kept
    ``LoadIndex`` (the simulator). A ``LoadIndex`` is registered as a ``Sequence`` without
    deriving from it (it is compiled: ``servefleet.compiled.MODULES``), so the policies ask
    of their replicas only what both give."""

    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[ReplicaView]: ...
    def __getitem__(self, i: int, /) -> ReplicaView: ...


PREFIX_HASHES = "prefix_hashes"
"""A need: ``RequestContext.prefix_hashes`` (a hash per chunk of the prompt costs the caller
time per request, so only policies that declare it get them)."""

PENDING_PREFILLS = "pending_prefills"
"""A need: a kept ``LoadIndex`` is updated when a view's pending prefills change (a first
token), not only when its load does (``LoadIndex.tracks_prefills``; an update per request
costs the caller a heap entry, so only policies that declare it get them)."""


class RoutingPolicy:
    """What every policy is. ``select`` is the one method a policy must write; the rest have
    defaults:

    * ``needs``: the optional parts of ``RequestContext`` it reads (``PREFIX_HASHES``) and the
      updates it wants of a kept index (``PENDING_PREFILLS``); the caller provides only those;
    * ``on_routed(replica, ctx)``: told where a request went (after every ``select`` that
      found one, and again when a request is retried or resumed elsewhere), so that it can
      learn, e.g. which replica now caches which prefix;
    * ``forget(name)``: a replica left the fleet.
    """

    name: str = ""
    needs: frozenset[str] = frozenset()

    def select(self, replicas: ReplicaViews, ctx: RequestContext) -> Selection | None:
        """Where to send ``ctx``, or None when no replica can take it."""
        raise NotImplementedError

    def on_routed(self, replica: ReplicaView, ctx: RequestContext) -> None:
        return None

    def forget(self, name: str) -> None:
        return None


def available(replicas: ReplicaViews) -> list[ReplicaView]:
    return [r for r in replicas if r.available]


def stable_hash(key: str) -> int:
    """A 64-bit hash that is the same in every process (Python's ``hash`` is salted)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")
