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
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from servefleet.records import RequestRecord
from servefleet.stats import Window

LAG_P99_LIMIT = 0.005
LOOP_LAG_P99_LIMIT = 0.010
CPU_LIMIT = 0.9
ACHIEVED_MIN = 0.95
RUNQUEUE_LIMIT = 0.05
MEANINGFUL_SHARE = 0.1
"""A client delay matters when it exceeds this share of the latency it affects."""


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


@dataclass(slots=True)
class SelfCheck:
    offered_rate: float
    achieved_rate: float
    send_lag_p50: float | None
    send_lag_p99: float | None
    send_lag_max: float | None
    loop_lag_p99: float | None
    loop_lag_max: float | None
    client_cpu: float
    open_loop: bool
    warnings: list[str] = field(default_factory=list)
    """Client delays that matter for this point's latencies (it is client-bound)."""
    runqueue_wait: float | None = None
    """Share of the wall time the client's loop thread was ready to run but had no CPU (other
    processes had them): a busy machine, which delays every timestamp."""
    notes: list[str] = field(default_factory=list)
    """Readings over their limits that are too small, next to the latencies, to matter."""

    @property
    def client_bound(self) -> bool:
        return bool(self.warnings)

    def to_dict(self) -> dict:
        return asdict(self) | {"client_bound": self.client_bound}

    @classmethod
    def from_dict(cls, d: dict) -> SelfCheck:
        names = set(cls.__slots__)
        return cls(**{k: v for k, v in d.items() if k in names})


def _pct(a: Sequence[float], q: float) -> float | None:
    return float(np.percentile(a, q)) if len(a) else None


def evaluate(
    records: Sequence[RequestRecord],
    window: Window,
    loop_lags: Sequence[float],
    client_cpu: float,
    *,
    open_loop: bool,
    scheduled_in_window: int | None = None,
    runqueue_wait: float | None = None,
    ttft_p50: float | None = None,
    itl_p50: float | None = None,
) -> SelfCheck:
    """Pure: the self-checks of a point from its records and the monitors' readings, judged
    against its latencies (``judge``)."""
    length = max(window.length, 1e-9)
    sent = [r for r in records if window.start <= r.scheduled_time < window.end]
    offered = (scheduled_in_window if scheduled_in_window is not None else len(sent)) / length
    achieved = sum(1 for r in records if window.start <= r.send_time < window.end) / length
    lags = [r.send_time - r.scheduled_time for r in sent]
    c = SelfCheck(
        offered_rate=offered,
        achieved_rate=achieved,
        send_lag_p50=_pct(lags, 50),
        send_lag_p99=_pct(lags, 99),
        send_lag_max=max(lags) if lags else None,
        loop_lag_p99=_pct(loop_lags, 99),
        loop_lag_max=max(loop_lags) if loop_lags else None,
        client_cpu=client_cpu,
        open_loop=open_loop,
        runqueue_wait=runqueue_wait,
    )
    return judge(c, ttft_p50, itl_p50)


def judge(c: SelfCheck, ttft_p50: float | None, itl_p50: float | None) -> SelfCheck:
    """Sort the readings over their limits into ``warnings`` (they matter for these latencies)
    and ``notes`` (they do not); returns ``c``, changed in place.

    Rule: the achieved rate below 95 % of the offered one always matters (the server did not
    see the load asked for). The send-schedule lag P99 (> 5 ms, open loop) matters when it is
    over 10 % of the TTFT P50 (requests leave late by a share of what they take). The event-loop
    lag P99 (> 10 ms) matters when it is over 10 % of the smallest of TTFT P50 and ITL P50 (every
    timestamp may be that late). High client CPU and CPU wait are causes, not effects: they
    matter only with one of the delays above, and are notes otherwise. Without latencies (no
    request succeeded) every reading over its limit matters."""
    c.warnings, c.notes = [], []

    def matters(delay: float, *latencies: float | None) -> bool:
        lat = [x for x in latencies if x is not None and x > 0]
        return not lat or delay > MEANINGFUL_SHARE * min(lat)

    def put(ok: bool, text: str) -> None:
        (c.warnings if ok else c.notes).append(text)

    if c.open_loop and c.offered_rate > 0 and c.achieved_rate < ACHIEVED_MIN * c.offered_rate:
        c.warnings.append(f"achieved {c.achieved_rate:.2f} req/s of {c.offered_rate:.2f} offered")
    if c.open_loop and c.send_lag_p99 is not None and c.send_lag_p99 > LAG_P99_LIMIT:
        put(
            matters(c.send_lag_p99, ttft_p50),
            f"send-schedule lag P99 {c.send_lag_p99 * 1000:.1f} ms > "
            f"{LAG_P99_LIMIT * 1000:g} ms: requests left later than the workload asked"
            + _beside(ttft_p50, "TTFT"),
        )
    if c.loop_lag_p99 is not None and c.loop_lag_p99 > LOOP_LAG_P99_LIMIT:
        put(
            matters(c.loop_lag_p99, ttft_p50, itl_p50),
            f"event-loop lag P99 {c.loop_lag_p99 * 1000:.1f} ms > "
            f"{LOOP_LAG_P99_LIMIT * 1000:g} ms: timestamps are late by up to that much"
            + _beside(itl_p50, "ITL"),
        )
    delayed = bool(c.warnings)
    if c.runqueue_wait is not None and c.runqueue_wait > RUNQUEUE_LIMIT:
        put(
            delayed or ttft_p50 is None,
            f"the client waited for a CPU {c.runqueue_wait:.0%} of the time: other processes "
            "(the server?) hold the cores",
        )
    if c.client_cpu > CPU_LIMIT:
        put(delayed or ttft_p50 is None, f"client CPU {c.client_cpu:.0%} of one core")
    return c


def _beside(latency: float | None, name: str) -> str:
    return "" if latency is None else f" (the {name} P50 is {latency * 1000:,.1f} ms)"
