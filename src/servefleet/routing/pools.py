"""Length-based pools: long prompts to their own replicas, so they never sit in front of
short ones in a prefill queue."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace

from servefleet.routing.base import (
    ReplicaView,
    ReplicaViews,
    RequestContext,
    RoutingPolicy,
    Selection,
)
from servefleet.routing.load_index import LoadIndex
from servefleet.routing.simple import LeastOutstanding

TOKEN_SHARE_DECAY = 0.999
"""Per request: the long prompts' token share follows roughly the last thousand requests."""
RECENT_REQUESTS = 4096
"""How many request ids the token share remembers having counted: a request selected again (a
retry, a wait for capacity, a resume elsewhere) comes back soon after its first selection."""
LONG_POOL = "long"
DEFAULT_POOL = "default"


class LengthPools(RoutingPolicy):
    """Rule: a prompt estimated above ``threshold`` tokens goes to the replicas of the
    ``long`` pool, every other prompt to the rest; each pool has its own policy. When no
    replica has ``pool == "long"``, the last replicas in name order form the long pool (at
    least one, never all): a fixed ``long_fraction`` of them, or by default as many as the
    long prompts' share of all prompt tokens seen so far (decayed, so it follows the mix; each
    request counted once, however often it is selected).
    With ``spill``, a request whose pool has no available replica goes to the other pool."""

    name = "length-pools"

    def __init__(
        self,
        threshold: int = 1500,
        long_policy: RoutingPolicy | None = None,
        default_policy: RoutingPolicy | None = None,
        long_fraction: float | None = None,
        spill: bool = True,
    ) -> None:
        if threshold < 1:
            raise ValueError(f"length-pools: threshold must be >= 1 token, got {threshold}")
        if long_fraction is not None and not 0 < long_fraction < 1:
            raise ValueError(f"length-pools: long_fraction must be in (0, 1), got {long_fraction}")
        self.threshold = threshold
        self.long_policy = long_policy or LeastOutstanding()
        self.default_policy = default_policy or LeastOutstanding()
        self.long_fraction = long_fraction
        self.spill = spill
        self.needs = self.long_policy.needs | self.default_policy.needs
        self._long_tokens = 0.0
        self._all_tokens = 0.0
        self._counted: OrderedDict[str, None] = OrderedDict()
        """The ids of the requests last counted in the token share (``RECENT_REQUESTS``)."""

    def _long_count(self, n: int) -> int:
        """How many of ``n`` replicas (last in name order) form the long pool when no
        replica is named for it."""
        frac = self.long_fraction
        if frac is None:
            frac = self._long_tokens / self._all_tokens if self._all_tokens else 0.0
        return min(n - 1, max(1, round(n * frac)))

    def long_names(self, replicas: ReplicaViews) -> set[str]:
        named = {r.name for r in replicas if r.pool == LONG_POOL}
        if named or len(replicas) < 2:
            return named
        names = sorted(r.name for r in replicas)
        return set(names[-self._long_count(len(names)) :])

    def _pools(self, replicas: ReplicaViews, is_long: bool) -> tuple[ReplicaViews, ReplicaViews]:
        """(this request's pool, the other pool)."""
        if isinstance(replicas, LoadIndex) and replicas.kept:
            split = replicas.companion(("length-pools", id(self)), _Split)
            split.resize(self._long_count)
            return (split.long, split.rest) if is_long else (split.rest, split.long)
        longs = self.long_names(replicas)
        mine = [r for r in replicas if (r.name in longs) == is_long]
        other = [r for r in replicas if (r.name in longs) != is_long]
        return mine, other

    def _count(self, ctx: RequestContext, is_long: bool) -> None:
        """Add ``ctx``'s prompt to the token share, unless it was counted already."""
        counted = self._counted
        if ctx.request_id in counted:
            return
        counted[ctx.request_id] = None
        if len(counted) > RECENT_REQUESTS:
            counted.popitem(last=False)
        decay = TOKEN_SHARE_DECAY
        self._all_tokens = self._all_tokens * decay + ctx.prompt_tokens
        self._long_tokens = self._long_tokens * decay + (ctx.prompt_tokens if is_long else 0)

    def select(self, replicas: ReplicaViews, ctx: RequestContext) -> Selection | None:
        is_long = ctx.prompt_tokens > self.threshold
        self._count(ctx, is_long)
        mine, other = self._pools(replicas, is_long)
        first, second = (
            (self.long_policy, self.default_policy)
            if is_long
            else (self.default_policy, self.long_policy)
        )
        pool = LONG_POOL if is_long else DEFAULT_POOL
        choice = first.select(mine, ctx) if len(mine) else None
        if choice is not None:
            return replace(choice, decision=f"{pool}:{choice.decision}")
        if self.spill and len(other):
            choice = second.select(other, ctx)
            if choice is not None:
                return replace(choice, decision=f"{pool}:spilled")
        return None

    def on_routed(self, replica: ReplicaView, ctx: RequestContext) -> None:
        self.long_policy.on_routed(replica, ctx)
        if self.default_policy is not self.long_policy:
            self.default_policy.on_routed(replica, ctx)

    def forget(self, name: str) -> None:
        self.long_policy.forget(name)
        if self.default_policy is not self.long_policy:
            self.default_policy.forget(name)


class _Split:
    """The two pools of a kept index as two subsets of it (``LoadIndex.subset``): the long
    pool is the replicas named for it, else the last ``k`` in name order; when ``k``
    changes, only the replicas that cross the boundary move (O(log n) each)."""

    __slots__ = ("by_rank", "k", "long", "named", "rest")

    def __init__(self, idx: LoadIndex) -> None:
        views = [idx.named(n) for n in idx.sorted_names]
        self.by_rank = [idx.position(v) for v in views if v is not None]
        longs = {idx.position(v) for v in idx if v.pool == LONG_POOL}
        self.named = bool(longs)
        self.k = len(longs)
        self.long = idx.subset(longs)
        self.rest = idx.subset({i for i in self.by_rank if i not in longs})

    def resize(self, long_count) -> None:
        n = len(self.by_rank)
        if self.named or n < 2:
            return
        k = long_count(n)
        while self.k < k:  # the boundary moves down: the replica above it turns long
            self.k += 1
            i = self.by_rank[n - self.k]
            self.rest.set_member(i, False)
            self.long.set_member(i, True)
        while self.k > k:
            i = self.by_rank[n - self.k]
            self.long.set_member(i, False)
            self.rest.set_member(i, True)
            self.k -= 1

    def update(self, i: int, view: ReplicaView, in_index: bool) -> None:
        return None  # the subsets are told by the index itself
