"""When to send, and when to stop — no sockets, no clock of its own.

``Schedule`` merges a workload source's up-front requests (``initial()``, in arrival order) with
the follow-ups that finishes release (``on_finish``: a session's next turn, a closed loop's next
request), and answers "what is next, and at what absolute time". ``StopRule`` says when sending
ends: by duration (no request whose arrival time is at or past it), by count, or both.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from servefleet.workload import RequestSpec, WorkloadSource


@dataclass(frozen=True, slots=True)
class StopRule:
    duration: float | None = None
    """Seconds of arrivals (requests scheduled at or after it are not sent)."""
    max_requests: int | None = None
    """Requests to send in all."""

    def __post_init__(self) -> None:
        if self.duration is None and self.max_requests is None:
            raise ValueError("a run needs a stop: a duration, a request count, or both")
        if self.duration is not None and not self.duration > 0:
            raise ValueError(f"duration must be > 0 s, got {self.duration}")
        if self.max_requests is not None and self.max_requests < 1:
            raise ValueError(f"the request count must be >= 1, got {self.max_requests}")

    def done(self, next_arrival: float, sent: int) -> bool:
        if self.max_requests is not None and sent >= self.max_requests:
            return True
        return self.duration is not None and next_arrival >= self.duration


class Schedule:
    """The next request to send, from ``source.initial()`` and the follow-ups so far."""

    def __init__(self, source: WorkloadSource):
        self.source = source
        self._initial: Iterator[RequestSpec] = iter(source.initial())
        self._head: RequestSpec | None = None
        self._heap: list[tuple[float, int, RequestSpec]] = []
        self._seq = itertools.count()
        self._initial_done = False
        self._advance()

    def _advance(self) -> None:
        self._head = next(self._initial, None)
        if self._head is None:
            self._initial_done = True

    def peek(self) -> RequestSpec | None:
        h = self._heap[0][2] if self._heap else None
        if self._head is None:
            return h
        if h is None or self._head.arrival_time <= h.arrival_time:
            return self._head
        return h

    def pop(self) -> RequestSpec:
        nxt = self.peek()
        assert nxt is not None
        if nxt is self._head:
            self._advance()
        else:
            heapq.heappop(self._heap)
        return nxt

    def finished(self, spec: RequestSpec, finish_time: float, output_tokens: int) -> int:
        """Report a finish; returns how many follow-ups it released."""
        follow = self.source.on_finish(spec, finish_time, output_tokens)
        for f in follow:
            heapq.heappush(self._heap, (f.arrival_time, next(self._seq), f))
        return len(follow)

    @property
    def exhausted(self) -> bool:
        return self._initial_done and not self._heap
