"""Choosing a replica for a request: the transport's side of routing. It builds the views the
policy sees (readiness from health, breaker and drain state; the model asked for), calls the
policy, and waits for capacity when every ready replica is at its in-flight cap. The choice
itself is the policy's alone."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from servefleet.gateway.errors import GatewayError
from servefleet.gateway.log import event
from servefleet.gateway.replica import HEALTHY, STARTING, Replica, ReplicaSet
from servefleet.routing import RequestContext, RoutingPolicy, Selection


@dataclass(slots=True)
class Choice:
    replica: Replica
    decision: str
    """The policy's label for this choice (affinity, miss, load, ...)."""
    expected_hit_tokens: int
    predicted_ttft: float | None
    """Unscaled by the replica's learned latency scale (None: the policy predicts none)."""


class Router:
    def __init__(
        self, replicas: ReplicaSet, policy: RoutingPolicy, panic_threshold: float = 0.5
    ) -> None:
        self.replicas = replicas
        self.policy = policy
        self.panic_threshold = panic_threshold
        self.panic = False
        """True while fewer than ``panic_threshold`` of the replicas that have been ready are
        healthy: those that failed their health checks then get traffic too."""

    def serving(self, model: str | None) -> list[Replica]:
        """Replicas (not draining) that serve ``model`` (all of them when unknown)."""
        reps = self.replicas.active()
        if model is None:
            return reps
        return [r for r in reps if not r.model_ids or model in r.model_ids]

    def check_model(self, model: str | None) -> None:
        if model is None:
            return
        known = [r for r in self.replicas.active() if r.health == HEALTHY and r.model_ids]
        if known and not any(model in r.model_ids for r in known):
            names = sorted({m for r in known for m in r.model_ids})
            raise GatewayError(
                404,
                f"The model `{model}` does not exist. The fleet serves: {', '.join(names)}.",
                "model_not_found",
                "model",
            )

    def choose(
        self, ctx: RequestContext, model: str | None, exclude: set[str]
    ) -> tuple[Replica | None, bool, Selection | None]:
        """(replica or None, whether a ready replica is merely full, the policy's selection)."""
        now = time.monotonic()
        serving = self.serving(model)
        seen = [r for r in serving if r.health != STARTING]
        healthy = sum(1 for r in seen if r.health == HEALTHY)
        panic = bool(seen) and healthy < self.panic_threshold * len(seen)
        if panic != self.panic:
            self.panic = panic
            event(
                logging.WARNING, "panic" if panic else "panic_over", healthy=healthy, of=len(seen)
            )
        reps = [r for r in serving if r.name not in exclude]
        views = []
        by_view = {}
        full = False
        for r in reps:
            v = r.view
            v.ready = r.routable(now, panic)
            if v.ready and v.max_in_flight is not None and v.in_flight >= v.max_in_flight:
                full = True
            views.append(v)
            by_view[id(v)] = r
        if not views:
            return None, False, None
        sel = self.policy.select(views, ctx)
        if sel is None:
            return None, full, None
        return by_view[id(sel.replica)], False, sel

    async def pick(
        self, ctx: RequestContext, model: str | None, exclude: set[str], deadline: float
    ) -> Choice:
        """A replica for ``ctx``: untried ones first, then any; waits for capacity while ready
        replicas are all full, until ``deadline`` (monotonic)."""
        while True:
            rep, full, sel = self.choose(ctx, model, exclude)
            if rep is None and exclude:
                rep, full2, sel = self.choose(ctx, model, set())
                full = full or full2
            if rep is not None and sel is not None:
                self.policy.on_routed(rep.view, ctx)
                pred = sel.predicted_ttft
                return Choice(
                    rep,
                    sel.decision,
                    sel.expected_hit_tokens,
                    pred / rep.view.latency_scale if pred else None,
                )
            left = deadline - time.monotonic()
            if not full or left <= 0:
                if full:
                    raise GatewayError(
                        503,
                        "Every ready replica is at its max_in_flight and none freed up in time.",
                        "replicas_full",
                        retry_after=1.0,
                    )
                raise GatewayError(
                    503,
                    "No replica is ready to serve this request (starting, unhealthy, ejected "
                    "or draining); retry later.",
                    "no_replica",
                    retry_after=1.0,
                )
            ev = self.replicas.changed
            ev.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(left, 0.5)):
                    await ev.wait()
