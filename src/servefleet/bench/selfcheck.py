"""Was the client, not the server, the bottleneck? Self-checks that come with every result.

* offered vs achieved rate: requests the schedule asked for inside the window, and those sent;
* send-schedule lag: actual − scheduled send time, per request (P50/P99/max);
* event-loop lag: how late a 5 ms ticker wakes up (P99/max) — a blocked loop delays timestamps;
* client CPU: process CPU seconds ÷ wall seconds (1.0 = one core busy; the client is one
  Python thread, so near 1.0 it is saturated);
* run-queue wait: the share of the time the client was ready to run but other processes held
  every core (Linux ``/proc/thread-self/schedstat``) — an oversubscribed machine.

``judge`` decides which readings matter. A client delay is only a bottleneck when it is a
meaningful share (``MEANINGFUL_SHARE``) of the latencies it distorts: a request sent 8 ms late
does not change a 22 s TTFT, but an event loop 5 ms late distorts 10 ms token gaps. Readings
over their limits that do not matter are kept as ``notes``; those that do are ``warnings``
(the point is then CLIENT BOTTLENECK).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from servefleet.stats import SelfCheck, evaluate, judge

__all__ = ["CpuMeter", "LoopMonitor", "SelfCheck", "evaluate", "judge", "runqueue_wait_ns"]


class LoopMonitor:
    """A ticker that measures how late the event loop wakes it. ``start()``/``stop()``."""

    def __init__(self, interval: float = 0.005):
        self.interval = interval
        self.lags: list[float] = []
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(self.interval)
            self.lags.append(max(0.0, time.perf_counter() - t - self.interval))


def runqueue_wait_ns(path: str = "/proc/thread-self/schedstat") -> int | None:
    """Nanoseconds this thread has spent runnable but waiting for a CPU (Linux schedstat)."""
    try:
        with open(path) as f:
            return int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None


class CpuMeter:
    """Client CPU (process CPU ÷ wall) and how long the event-loop thread waited for a CPU
    that other processes held (``runqueue_wait``: its share of the wall time)."""

    def __init__(self) -> None:
        self.cpu0 = time.process_time()
        self.wall0 = time.perf_counter()
        self.rq0 = runqueue_wait_ns()

    def fraction(self) -> float:
        wall = max(time.perf_counter() - self.wall0, 1e-9)
        return (time.process_time() - self.cpu0) / wall

    def runqueue_wait(self) -> float | None:
        rq = runqueue_wait_ns()
        if rq is None or self.rq0 is None:
            return None
        return (rq - self.rq0) / 1e9 / max(time.perf_counter() - self.wall0, 1e-9)
