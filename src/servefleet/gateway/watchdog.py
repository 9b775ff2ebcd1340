"""Hung replicas: a replica that owes tokens to streams but has sent none for a while, or
that has not begun a stream it was sent within its first-token deadline.

A decode step sends a token to every running stream at once, so a replica whose streams *all*
went quiet has stopped (a SIGSTOP, a stuck engine, a dead GPU) even while its ``/health``
still answers; one quiet stream among moving ones is only waiting (preempted, queued). The
limit is ``stall_factor`` x the replica's usual gap between events (learned), at least
``min_stall``, at most ``idle_timeout``. A hung replica's breaker trips (it gets no new
requests, then one trial), and its streams resume elsewhere at once.

A replica hung before it answers (its ``/health`` still 200) has no stream to go quiet: a
stream waiting for its first event longer than ``first_token_factor`` x the replica's usual
time to first token (learned; at least ``min_first_token``, at most ``idle_timeout``), while the
replica sent no event to any stream since it was sent, finds it hung too; the request is
retried elsewhere (nothing reached the client). A stream only queued behind others sees
their events go by and waits on. Streams paused by their client count for neither rule.
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


def first_token_limit(cfg: StreamConfig, expected: float) -> float:
    """Seconds a stream may wait for its first event (``expected``: the replica's usual; 0
    while nothing is learned, when only ``idle_timeout`` applies: a first long prompt is no
    evidence)."""
    if expected <= 0:
        return cfg.idle_timeout
    return min(cfg.idle_timeout, max(cfg.min_first_token, cfg.first_token_factor * expected))


def first_token_overdue(rep: Replica, now: float) -> float | None:
    """How long a stream sent to ``rep`` has waited for its first event with no event from
    ``rep`` to any stream meanwhile, when that is past the stream's deadline."""
    for a in rep.attempts:
        since = a.waiting_since
        if since is None:
            continue
        waited = now - max(since, rep.progress_at)
        if waited > a.first_deadline:
            return waited
    return None


class Watchdog:
    def __init__(
        self,
        replicas: ReplicaSet,
        cfg: StreamConfig,
        on_hung: Callable[[Replica, str, str], None],
    ) -> None:
        self.replicas = replicas
        self.cfg = cfg
        self.on_hung = on_hung
        """Called with (replica, source, why): ``stall`` or ``first_token``."""
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
        floor = self.cfg.min_first_token
        for rep in self.replicas:
            quiet = stalled_for(self.cfg, rep, now)
            if quiet is not None:
                why = f"no event on any of its {rep.streaming} streams for {quiet:.2f} s"
                self.on_hung(rep, "stall", why)
            elif now - rep.progress_at > floor and (waited := first_token_overdue(rep, now)):
                why = f"a stream sent {waited:.2f} s ago got no first event, nor any other"
                self.on_hung(rep, "first_token", why)

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.tick)
            with contextlib.suppress(Exception):
                self.check(loop.time())
