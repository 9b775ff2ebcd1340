"""Active health checks: each replica's ``/health`` every ``interval``; ``healthy_threshold``
successes in a row make it ready (and its ``/v1/models`` is read then), ``unhealthy_threshold``
failures in a row eject it. One task per replica; ``kick`` probes at once (after a failure
seen on real traffic)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable

from servefleet.gateway.config import HealthConfig
from servefleet.gateway.log import event
from servefleet.gateway.replica import HEALTHY, STARTING, UNHEALTHY, Replica, ReplicaSet


class HealthChecker:
    def __init__(
        self,
        replicas: ReplicaSet,
        cfg: HealthConfig,
        on_state: Callable[[Replica, str, str], None] | None = None,
    ) -> None:
        self.replicas = replicas
        self.cfg = cfg
        self.on_state = on_state
        self._tasks: dict[int, asyncio.Task] = {}
        self._kicks: dict[int, asyncio.Event] = {}
        self._running = False

    async def start(self) -> None:
        self._running = True
        for rep in self.replicas:
            self.watch(rep)

    async def stop(self) -> None:
        self._running = False
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def watch(self, rep: Replica) -> None:
        if not self._running or id(rep) in self._tasks:
            return
        self._kicks[id(rep)] = asyncio.Event()
        self._tasks[id(rep)] = asyncio.create_task(self._loop(rep), name=f"health-{rep.name}")

    def unwatch(self, rep: Replica) -> None:
        t = self._tasks.pop(id(rep), None)
        self._kicks.pop(id(rep), None)
        if t is not None:
            t.cancel()

    def kick(self, rep: Replica) -> None:
        ev = self._kicks.get(id(rep))
        if ev is not None:
            ev.set()

    async def _loop(self, rep: Replica) -> None:
        kick = self._kicks[id(rep)]
        while True:
            ok, why = await self.probe(rep)
            self._record(rep, ok, why)
            kick.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.cfg.interval):
                    await kick.wait()

    async def probe(self, rep: Replica) -> tuple[bool, str]:
        if rep.closed:
            return False, "closed"
        try:
            reply = await rep.fetch("GET", self.cfg.path, timeout=self.cfg.timeout, rid="health")
            if reply.status != 200:
                return False, f"HTTP {reply.status}"
            due = rep.health != HEALTHY and rep.successes + 1 >= self.cfg.healthy_threshold
            if due and not await self._read_models(rep):
                return False, "bad /v1/models"
            return True, ""
        except (OSError, TimeoutError) as exc:
            return False, type(exc).__name__

    async def _read_models(self, rep: Replica) -> bool:
        reply = await rep.fetch("GET", "/v1/models", timeout=self.cfg.timeout, rid="health")
        try:
            body = json.loads(reply.body) if reply.status == 200 else None
        except ValueError:
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("data"), list):
            return False
        data = [m for m in body["data"] if isinstance(m, dict) and isinstance(m.get("id"), str)]
        rep.models = data
        rep.model_ids = {m["id"] for m in data}
        lens = [m["max_model_len"] for m in data if isinstance(m.get("max_model_len"), int)]
        rep.max_model_len = min(lens) if lens else None
        return True

    def _record(self, rep: Replica, ok: bool, why: str) -> None:
        before = rep.health
        if ok:
            rep.successes += 1
            rep.failures = 0
            if rep.health != HEALTHY and rep.successes >= self.cfg.healthy_threshold:
                rep.health = HEALTHY
                rep.breaker.reset()
                self.replicas.notify()
        else:
            rep.failures += 1
            rep.successes = 0
            if rep.health == HEALTHY and rep.failures >= self.cfg.unhealthy_threshold:
                rep.health = UNHEALTHY
            if rep.health != HEALTHY and before == STARTING and rep.failures == 1:
                event(logging.DEBUG, "replica_not_ready", replica=rep.name, why=why)
            if before == HEALTHY:
                rep.note_error("health", why)
        if rep.health != before:
            level = logging.INFO if rep.health == HEALTHY else logging.WARNING
            event(level, "replica_health", replica=rep.name, state=rep.health, was=before, why=why)
            if self.on_state is not None:
                self.on_state(rep, before, rep.health)
