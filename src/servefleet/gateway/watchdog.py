"""Hung replicas: a replica that owes tokens to streams but has sent none for a while.

A decode step sends a token to every running stream at once, so a replica whose streams *all*
went quiet has stopped (a SIGSTOP, a stuck engine, a dead GPU) even while its ``/health``
still answers; one quiet stream among moving ones is only waiting (preempted, queued). The
limit is ``stall_factor`` x the replica's usual gap between events (learned), at least
``min_stall``, at most ``idle_timeout``. A hung replica's breaker trips (it gets no new
requests, then one trial), and its streams resume elsewhere at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from servefleet.gateway.config import StreamConfig
from servefleet.gateway.replica import Replica, ReplicaSet


def stall_limit(cfg: StreamConfig, itl: float) -> float:
    """Seconds without an event after which a replica's streams are stalled."""
    return min(cfg.idle_timeout, max(cfg.min_stall, cfg.stall_factor * itl))


def stalled_for(cfg: StreamConfig, rep: Replica, now: float) -> float | None:
    """How long ``rep``'s streams have all been quiet, when that is past its limit."""
    if rep.streaming <= 0:
        return None
    quiet = now - rep.progress_at
    return quiet if quiet > stall_limit(cfg, rep.itl) else None


class Watchdog:
    def __init__(
        self,
        replicas: ReplicaSet,
        cfg: StreamConfig,
        on_hung: Callable[[Replica, float], None],
    ) -> None:
        self.replicas = replicas
        self.cfg = cfg
        self.on_hung = on_hung
        self.tick = max(0.05, min(0.25, cfg.min_stall / 4))
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="gateway-watchdog")

    async def stop(self) -> None:
        t, self._task = self._task, None
        if t is not None:
            t.cancel()
            await asyncio.gather(t, return_exceptions=True)

    def check(self, now: float) -> None:
        for rep in self.replicas:
            quiet = stalled_for(self.cfg, rep, now)
            if quiet is not None:
                self.on_hung(rep, quiet)

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.tick)
            with contextlib.suppress(Exception):
                self.check(loop.time())
