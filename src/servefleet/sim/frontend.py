"""vLLM's API server in front of one engine: one CPU that admits requests and streams tokens.

vLLM 0.26's API server is one asyncio event loop (``vllm/v1/engine/async_llm.py``). Each HTTP
request's handler renders and tokenizes its prompt and hands it to the engine core; a
background ``output_handler`` task pulls each engine step's outputs and pushes them into
per-request queues (``RequestOutputCollector``, which merges outputs its reader has not taken
yet); each request's streaming generator then wakes, detokenizes and writes an SSE chunk. The
loop runs every ready handler in turn, so all of this shares one CPU round-robin.

The model: one processor shared equally by its tasks (processor sharing, the limit of an event
loop's turns), with two kinds of task:

* **admitting** a request: ``request_s + prompt_token_s * prompt tokens`` of CPU; the request
  reaches the scheduler ``latency_s`` after its admission is done (IPC, fixed costs). Admissions
  finish **in arrival order**: every handler goes through the same stages in turn (rendering,
  the tokenizer's one FIFO thread, ``AsyncMicrobatchTokenizer``), so a short prompt behind a long
  one waits for it (processor sharing alone would let it overtake, i.e. reorder a wave shortest
  first, which real vLLM does not: docs/real-gpu.md);
* **streaming** a step's tokens: one chunk of ``chunk_s`` per request with new tokens, plus
  ``token_s`` per token it carries. The chunks of a step are sent together; while they are
  being sent, later steps' tokens wait and merge (one chunk per request carries them all), as
  vLLM's output collectors merge them. Both costs depend on how the clients stream
  (``sim.client_protocol``).

A step's tokens reach the client when its chunks are done. A wave of requests arriving together
is admitted together (each is ``n`` times slower), reaching the engine as a burst, not as a
trickle (a FIFO server would let the first ones through at once); and a loaded server delivers tokens
late and in clumps. docs/validation.md ("The API-server model") has the evidence.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import Any, Final

# Final: compiled code reads these as constants (docs/simulate.md, "A compiled core")
heappush: Final = heapq.heappush
heappop: Final = heapq.heappop
_EPS: Final = 1e-9
NOTHING: Final[list] = []
"""A shared empty list, never changed: what ``Frontend.advance`` returns for none (its callers
only read what it returns), and what a caller gives ``Frontend.stream`` for no finished
requests (it keeps or copies that list and changes only its copies)."""
"""Work (s) below which a task counts as done (rounding of the virtual clock)."""


class SharedCPU:
    """One CPU shared equally by the tasks on it (egalitarian processor sharing).

    ``_v`` is the work every task present has received so far (it grows at ``1 / n`` per
    second with ``n`` tasks): a task of ``work`` added at ``_v = v0`` is done at ``v0 + work``.
    Tasks added together with equal work may be added as one entry of ``count`` tasks.
    """

    __slots__ = ("_heap", "_n", "_seq", "_t", "_v")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, object]] = []
        self._n = 0
        self._seq = 0
        self._t = 0.0
        self._v = 0.0

    def _advance(self, t: float) -> None:
        if self._n:
            self._v += (t - self._t) / self._n
        self._t = t

    def add(self, t: float, work: float, count: int, item: object) -> None:
        """At ``t``, add ``count`` tasks of ``work`` seconds each, reported together as ``item``."""
        self._advance(t)
        seq = self._seq
        self._seq = seq + 1
        heappush(self._heap, (self._v + work, seq, count, item))
        self._n += count

    def next_done(self) -> float:
        """When the next task finishes if nothing is added (inf when idle)."""
        if not self._heap:
            return math.inf
        return self._t + max(self._heap[0][0] - self._v, 0.0) * self._n

    def pop_done(self, t: float) -> list[object]:
        """Advance to ``t`` and return the items whose tasks are done, in order."""
        self._advance(t)
        heap, done = self._heap, []
        while heap and heap[0][0] <= self._v + _EPS:
            _, _, count, item = heappop(heap)
            self._n -= count
            done.append(item)
        if not heap:
            self._v = 0.0  # idle: restart the virtual clock (keeps it precise)
        return done


class Delivery:
    """The tokens of engine steps ``first_step..last_step``, sent as one chunk per request
    (a plain class with its own ``__init__``, as the next one: docs/simulate.md, "A compiled
    core")."""

    __slots__ = ("chunks", "finished", "first_step", "last_step", "time", "tokens")

    def __init__(self, first_step: int, last_step: int, chunks: int, finished: list) -> None:
        self.first_step = first_step
        self.last_step = last_step
        self.chunks = chunks
        self.tokens = chunks
        """The tokens the chunks carry (one per request and step)."""
        self.finished = finished
        """Requests whose last token is in these steps (they finish when it is delivered)."""
        self.time = 0.0
        """When the chunks were sent (set by ``Frontend.advance``)."""


class _Admission:
    __slots__ = ("done", "payload")

    def __init__(self, payload: Any) -> None:
        self.payload = payload
        self.done = False


class Frontend:
    """One API-server process (see the module's docstring); costs come from ``Efficiency``."""

    __slots__ = (
        "_admitting",
        "_next",
        "_sending",
        "chunk_s",
        "cpu",
        "latency_s",
        "prompt_token_s",
        "request_s",
        "token_s",
    )

    def __init__(
        self,
        latency_s: float = 0.0,
        request_s: float = 0.0,
        prompt_token_s: float = 0.0,
        chunk_s: float = 0.0,
        token_s: float = 0.0,
    ) -> None:
        if min(latency_s, request_s, prompt_token_s, chunk_s, token_s) < 0:
            raise ValueError("API-server latency and costs must be >= 0")
        self.latency_s = latency_s
        self.request_s = request_s
        self.prompt_token_s = prompt_token_s
        self.chunk_s = chunk_s
        self.token_s = token_s
        self.cpu = SharedCPU()
        self._sending: Delivery | None = None
        self._next: Delivery | None = None
        self._admitting: deque[_Admission] = deque()
        """Admissions in arrival order; one leaves when it and all before it are done."""

    def admit(self, t: float, prompt_tokens: int, payload: Any) -> None:
        """A request arrives at ``t``; ``payload`` comes back from ``advance`` once admitted."""
        work = self.request_s + self.prompt_token_s * prompt_tokens
        adm = _Admission(payload)
        self._admitting.append(adm)
        self.cpu.add(t, work, 1, adm)

    def stream(self, t: float, step: int, chunks: int, finished: list) -> None:
        """Engine step ``step`` ended at ``t`` with new tokens for ``chunks`` requests, the
        last ones of ``finished`` (kept or copied, never changed)."""
        nxt = self._next
        if self._sending is None:
            self._send(t, Delivery(step, step, chunks, finished))
        elif nxt is None:
            self._next = Delivery(step, step, chunks, list(finished))
        else:  # merges into the chunks waiting to be sent
            nxt.last_step = step
            nxt.chunks = max(nxt.chunks, chunks)
            nxt.tokens += chunks
            nxt.finished.extend(finished)

    def _send(self, t: float, d: Delivery) -> None:
        self._sending = d
        work = self.chunk_s
        if self.token_s > 0.0 and d.chunks:
            work += self.token_s * d.tokens / d.chunks
        self.cpu.add(t, work, d.chunks, d)

    def next_event(self) -> float:
        """When the next task that matters to others is done, if nothing is added: an
        admission, or a delivery that finishes a request (inf if none). Deliveries that only
        carry tokens need no event of their own: ``advance`` gives each its exact time later,
        whenever it is called. While such a task waits, this is the next task's time (every
        task is then taken in its turn)."""
        sending, nxt = self._sending, self._next
        if (
            self._admitting
            or (sending is not None and sending.finished)
            or (nxt is not None and nxt.finished)
        ):
            return self.cpu.next_done()
        return math.inf

    def advance(
        self, t: float, inclusive: bool = True
    ) -> tuple[list[tuple[float, Any]], list[Delivery]]:
        """Do the work done before ``t`` (and at ``t``, if ``inclusive``), each task at the time
        it is done: (time, payload) of the requests admitted, and the deliveries (in order,
        ``Delivery.time`` set; an empty list may be shared: read them, do not change them).
        The next delivery is sent when the one before it is done."""
        admitted: list[tuple[float, Any]] = NOTHING  # made at the first one (most calls
        delivered: list[Delivery] = NOTHING  # have none)
        cpu, queue = self.cpu, self._admitting
        while True:
            due = cpu.next_done()
            if due > t or (due == t and not inclusive) or due == math.inf:
                return admitted, delivered
            for item in cpu.pop_done(due):
                if isinstance(item, Delivery):
                    item.time = due
                    if delivered is NOTHING:
                        delivered = []
                    delivered.append(item)
                    self._sending = None
                    if self._next is not None:
                        nxt, self._next = self._next, None
                        self._send(due, nxt)
                else:
                    item.done = True  # type: ignore[attr-defined]
            while queue and queue[0].done:
                if admitted is NOTHING:
                    admitted = []
                admitted.append((due, queue.popleft().payload))
