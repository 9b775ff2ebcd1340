"""Waiting until an absolute time on the event loop, to within tens of microseconds.

asyncio's timers are coarse for this job: the default loop rounds selector timeouts up to the
millisecond and uvloop keeps time in whole milliseconds, and a virtual machine adds its own
wake-up latency (0.1-0.5 ms measured on the 2-core CI machine). The sim-server must deliver a
step's tokens within a fraction of a millisecond of the step's modelled end, so ``Waiter``:

1. sleeps on a coarse timer until ``deadline - margin`` (a Linux ``timerfd`` armed at an absolute
   CLOCK_MONOTONIC time when available, else ``loop.call_at``);
2. then yields to the loop (``asyncio.sleep(0)``) until the deadline: other tasks, such as the
   handlers writing the previous step's tokens, keep running while it waits;
3. learns the margin: the 95th percentile of the coarse timer's recent overshoots plus a little,
   so the yielding phase stays short (a few percent of a core) on a quiet machine.

The clock is ``time.monotonic`` (CLOCK_MONOTONIC), the clock the timerfd uses; uvloop's
``loop.time()`` only has millisecond resolution.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import sys
import time
from collections import deque

clock = time.monotonic

MIN_MARGIN_S = 100e-6
"""Smallest spin margin: below this the coarse timer alone decides (it rarely fires early)."""
MAX_MARGIN_S = 1e-3
"""Largest spin margin, so a noisy neighbour cannot make the server spin half of each step."""
MARGIN_SLACK_S = 50e-6
"""Added to the observed overshoot percentile."""
WINDOW = 256
"""Coarse-timer overshoots remembered for the percentile."""


class _TimerFD:
    """A CLOCK_MONOTONIC timerfd armed at absolute times, read by the event loop."""

    CLOCK_MONOTONIC = 1
    TFD_TIMER_ABSTIME = 1
    TFD_NONBLOCK = 0o4000
    TFD_CLOEXEC = 0o2000000

    class _Itimerspec(ctypes.Structure):
        _fields_ = (("it_interval", ctypes.c_long * 2), ("it_value", ctypes.c_long * 2))

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        self._settime = libc.timerfd_settime
        fd = libc.timerfd_create(self.CLOCK_MONOTONIC, self.TFD_NONBLOCK | self.TFD_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create failed")
        self.fd = fd
        self._loop = loop
        self._fut: asyncio.Future[None] | None = None
        loop.add_reader(fd, self._on_ready)

    def _on_ready(self) -> None:
        try:
            os.read(self.fd, 8)
        except BlockingIOError:
            return
        fut = self._fut
        if fut is not None and not fut.done():
            fut.set_result(None)

    def wait_until(self, deadline: float) -> asyncio.Future[None]:
        ns = max(1, int(deadline * 1e9))
        spec = self._Itimerspec()
        spec.it_value[0], spec.it_value[1] = divmod(ns, 1_000_000_000)
        if self._settime(self.fd, self.TFD_TIMER_ABSTIME, ctypes.byref(spec), None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")
        self._fut = self._loop.create_future()
        return self._fut

    def close(self) -> None:
        self._loop.remove_reader(self.fd)
        os.close(self.fd)


class Waiter:
    """``await waiter.until(t)`` returns at ``clock() >= t``, a few microseconds late at best."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._tfd: _TimerFD | None = None
        if sys.platform.startswith("linux"):
            try:
                self._tfd = _TimerFD(self._loop)
            except (OSError, AttributeError, NotImplementedError):
                self._tfd = None
        self._overshoot: deque[float] = deque(maxlen=WINDOW)
        self.margin = 0.5e-3
        self.yields = 0
        """Loop iterations spent in the yielding phase (for the CPU cost in /sim/stats)."""

    async def until(self, deadline: float, max_margin: float = MAX_MARGIN_S) -> None:
        """``max_margin`` caps the yielding phase (a quarter of a short step, so a fast
        ``--time-scale`` does not turn the wait into a busy loop)."""
        coarse = deadline - min(self.margin, max_margin)
        if coarse - clock() > 20e-6:
            if self._tfd is not None:
                await self._tfd.wait_until(coarse)
            else:
                fut = self._loop.create_future()
                handle = self._loop.call_at(self._loop.time() + (coarse - clock()), _resolve, fut)
                try:
                    await fut
                finally:
                    handle.cancel()
            self._learn(clock() - coarse)
        else:
            # no coarse wait (the deadline is here or past): still let the ready tasks (the
            # handlers writing the last step's tokens) run once, so a late loop catching up
            # does not starve them
            self.yields += 1
            await asyncio.sleep(0)
        while clock() < deadline:
            self.yields += 1
            await asyncio.sleep(0)

    def _learn(self, overshoot: float) -> None:
        window = self._overshoot
        window.append(overshoot)
        if len(window) >= 16 and len(window) % 8 == 0:
            ranked = sorted(window)
            p95 = ranked[int(0.95 * (len(ranked) - 1))]
            self.margin = min(MAX_MARGIN_S, max(MIN_MARGIN_S, p95 + MARGIN_SLACK_S))

    def close(self) -> None:
        if self._tfd is not None:
            self._tfd.close()
            self._tfd = None


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
