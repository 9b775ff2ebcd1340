"""Admission: a gateway-wide concurrency cap with a bounded FIFO queue in front of it.

``acquire()`` takes a slot at once when one is free and nobody queues, else waits in FIFO
order; a full queue answers 429 at once, a wait past ``max_wait`` answers 503. Both carry
``Retry-After``. Every request admitted must ``release()`` exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque

from servefleet.gateway.errors import GatewayError


class Admission:
    def __init__(self, max_concurrency: int, max_queue: int, max_wait: float) -> None:
        self.max_concurrency = max_concurrency
        self.max_queue = max_queue
        self.max_wait = max_wait
        self.active = 0
        self._queue: deque[asyncio.Future[None]] = deque()
        self._recent_wait = 0.0
        """EWMA of queue waits (seconds), for Retry-After."""

    @property
    def queued(self) -> int:
        return len(self._queue)

    def retry_after(self) -> float:
        return max(1.0, self._recent_wait * 2)

    async def acquire(self) -> float:
        """Seconds waited in the queue (0.0 when a slot was free)."""
        if self.active < self.max_concurrency and not self._queue:
            self.active += 1
            return 0.0
        if len(self._queue) >= self.max_queue:
            raise GatewayError(
                429,
                f"The gateway is at capacity: {self.active} requests in flight and "
                f"{len(self._queue)} queued (max_queue {self.max_queue}). Retry later.",
                "queue_full",
                retry_after=self.retry_after(),
            )
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append(fut)
        t0 = time.monotonic()
        try:
            async with asyncio.timeout(self.max_wait):
                await asyncio.shield(fut)
        except TimeoutError:
            if fut.done() and not fut.cancelled():  # granted just as the wait ran out
                return self._waited(t0)
            fut.cancel()
            self._remove(fut)
            raise GatewayError(
                503,
                f"The request waited {self.max_wait:g} s in the gateway's queue without a free "
                "slot (max_queue_wait). The fleet is overloaded; retry later.",
                "queue_timeout",
                retry_after=self.retry_after(),
            ) from None
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # the slot was handed over; give it back
            else:
                fut.cancel()
                self._remove(fut)
            raise
        return self._waited(t0)

    def _waited(self, t0: float) -> float:
        w = time.monotonic() - t0
        self._recent_wait = 0.8 * self._recent_wait + 0.2 * w
        return w

    def _remove(self, fut: asyncio.Future[None]) -> None:
        with contextlib.suppress(ValueError):
            self._queue.remove(fut)

    def release(self) -> None:
        """Hand the slot to the first waiter, or free it."""
        q = self._queue
        while q:
            fut = q.popleft()
            if not fut.done():
                fut.set_result(None)  # the slot passes on; active stays the same
                return
        self.active -= 1


class PerClient:
    """How many of something (streams) each client has open, capped: ``enter`` is refused
    (False) at ``cap``; every ``enter`` that returned True must ``leave`` exactly once."""

    __slots__ = ("cap", "open")

    def __init__(self, cap: int | None) -> None:
        self.cap = cap
        self.open: dict[str, int] = {}

    def enter(self, who: str) -> bool:
        n = self.open.get(who, 0)
        if self.cap is not None and n >= self.cap:
            return False
        self.open[who] = n + 1
        return True

    def leave(self, who: str) -> None:
        n = self.open.get(who, 0) - 1
        if n > 0:
            self.open[who] = n
        else:
            self.open.pop(who, None)


class Budget:
    """Bytes held at once, all requests together, up to ``limit``: ``take`` is refused
    (False) past it; every byte taken must be ``give``n back once."""

    __slots__ = ("held", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def fits(self, n: int) -> bool:
        return self.held + n <= self.limit

    def take(self, n: int) -> bool:
        if self.held + n > self.limit:
            return False
        self.held += n
        return True

    def give(self, n: int) -> None:
        self.held -= n
