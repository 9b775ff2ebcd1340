"""vLLM V1 scheduling under a token budget.

The one rule: every request has ``num_tokens`` (prompt + output so far) and
``num_computed_tokens``; each step the scheduler lets computed tokens catch up with total tokens
under one budget of ``max_num_batched_tokens`` shared by decodes and (chunked) prefills, running
requests first, then waiting ones.

* **Running** requests, in admission order, each get ``min(tokens left, budget left)``. When
  their blocks cannot hold the new tokens, the newest running request is preempted (its blocks
  freed, its computed tokens dropped; it goes back to the front of the queue) until they can,
  or until the request itself was the newest.
* **Waiting** requests, first come first served, while budget, sequence slots
  (``max_num_seqs``) and blocks last, and only in a step that preempted nothing: each is looked
  up in the prefix cache (whole cached blocks that prefix it), then gets blocks for the rest,
  up to the budget (a chunked prefill). The first that does not fit stops the admissions.
* After the step, every request whose computed tokens reach its total samples one token; one
  that reaches ``max_tokens`` finishes and frees its blocks.

With async scheduling (vLLM's default since 0.12) the engine core schedules step k+1 right after
it launches step k, before a request that arrives during step k can be seen; so such a request
is admitted in step k+2 at the earliest, unless step k+1 has nothing else to run (then the
engine core waits for step k and schedules the new request with it). A request that arrives at
an idle engine is admitted at once. Under load this costs a new request up to one more step of
queueing, a long one when the steps carry prefill chunks (docs/validation.md).

The fleet simulator runs the same rule through a faster implementation (``servefleet.fastpath``),
checked against this one step by step (``tests/test_scheduler_lazy.py``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from servefleet.engine.config import SchedulerConfig
from servefleet.engine.kv_cache_manager import KVCacheManager
from servefleet.engine.request import Request, RequestStatus


@dataclass
class SchedulerOutput:
    """What one step computes: requests and their token counts, and the batch's shape."""

    reqs: list[Request] = field(default_factory=list)
    """Every request scheduled: running ones in order, then those admitted."""
    num_scheduled: list[int] = field(default_factory=list)
    """Tokens scheduled for each of ``reqs``."""
    preempted: list[Request] = field(default_factory=list)
    num_tokens: int = 0
    num_decodes: int = 0
    decode_context: int = 0
    """Sum over decodes of the context each attends to (KV tokens read)."""
    prefill_chunks: list[tuple[int, int]] = field(default_factory=list)
    """(new tokens, tokens already computed) for every non-decode request."""
    num_sampled: int = 0
    """Requests whose computed tokens reach their total: they sample a token this step."""
    first_tokens: list[Request] = field(default_factory=list)
    """Requests that got their first output token in this step (set by
    ``update_from_output``)."""

    @property
    def num_seqs(self) -> int:
        """How many requests were scheduled."""
        return len(self.reqs)

    @property
    def is_decode_only(self) -> bool:
        return not self.prefill_chunks

    def add(self, req: Request, n: int) -> None:
        """Schedule ``n`` tokens of ``req`` (its computed tokens advance by them)."""
        computed = req.num_computed_tokens
        self.reqs.append(req)
        self.num_scheduled.append(n)
        self.num_tokens += n
        req.num_computed_tokens = computed + n
        if req.num_computed_tokens == req.num_tokens:
            self.num_sampled += 1
            if n == 1:
                self.num_decodes += 1
                self.decode_context += computed + 1
                return
        self.prefill_chunks.append((n, computed))


class Scheduler:
    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.kv = KVCacheManager(
            config.num_gpu_blocks, config.block_size, config.enable_prefix_caching
        )
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        """In admission order (the newest last: the first to be preempted)."""
        self.requests: dict[str, Request] = {}
        self.step_index = 0
        self.in_flight = False
        """A step has been scheduled and the next ``schedule()`` call has not come yet."""

    def add_request(self, req: Request) -> None:
        if req.request_id in self.requests:
            raise ValueError(f"duplicate request id {req.request_id!r}")
        self.requests[req.request_id] = req
        # While step k runs, step k+1 is already scheduled (async scheduling): the request
        # waits for k+2. ``step_index`` is k+1 here.
        late = self.in_flight and self.config.async_scheduling
        req.ready_step = self.step_index + 1 if late else self.step_index
        self.waiting.append(req)

    def finish_request(self, request_id: str, status: RequestStatus) -> Request | None:
        """Finish (e.g. abort) a request now; frees its blocks. None if unknown/finished."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return None
        if req.status == RequestStatus.RUNNING:
            self.running.remove(req)
        else:
            self.waiting.remove(req)
        req.status = status
        self.kv.free(req)
        return req

    @property
    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def schedule(self) -> SchedulerOutput:
        """Running requests first (preempting the newest when blocks run out), then waiting
        ones while budget, sequence slots and blocks last; no admissions in a step that
        preempted."""
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        budget = self._schedule_running(out, budget)
        if not out.preempted:
            self._schedule_waiting(out, budget)
        if out.num_seqs:
            self.step_index += 1
        self.in_flight = out.num_seqs > 0
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        running = self.running
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            while not self.kv.allocate_slots(req, n):
                victim = running.pop()
                self._preempt(victim, out)
                if victim is req:
                    return budget
            out.add(req, n)
            budget -= n
            i += 1
        return budget

    def _preempt(self, req: Request, out: SchedulerOutput) -> None:
        self.kv.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_before_preemption = req.num_computed_tokens
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.waiting.appendleft(req)
        out.preempted.append(req)

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        kv, waiting, running = self.kv, self.waiting, self.running
        while waiting and budget > 0 and len(running) < self.config.max_num_seqs:
            req = waiting[0]
            if req.ready_step > self.step_index and out.num_tokens:
                break  # arrived after this step was scheduled; later ones too (FIFO)
            hit_blocks, num_hit = kv.get_computed_blocks(req)
            kv.record_lookup(req, num_hit)
            n = min(req.num_tokens - num_hit, budget)
            if not kv.allocate_slots(req, n, hit_blocks, num_hit):
                break
            waiting.popleft()
            if req.num_cached_tokens is None:
                req.num_cached_tokens = num_hit
                req.first_scheduled_step = self.step_index
                kv.record_admission(req, num_hit)
            else:  # resumed after preemption: what is not found again is computed twice
                req.num_recomputed_tokens += max(0, req.num_computed_before_preemption - num_hit)
            req.num_computed_tokens = num_hit
            req.status = RequestStatus.RUNNING
            running.append(req)
            out.add(req, n)
            budget -= n

    def update_from_output(self, out: SchedulerOutput, step: int) -> list[Request]:
        """Append the sampled token of every request that caught up; finish those that reached
        ``max_tokens``. Returns the requests that finished."""
        finished: list[Request] = []
        for req in out.reqs:
            if req.num_computed_tokens != req.num_tokens:
                continue  # a partial prefill samples nothing
            req.num_output_tokens += 1
            if req.num_output_tokens == 1:
                out.first_tokens.append(req)
            req.record_token(step)
            if req.num_output_tokens >= req.max_tokens:
                req.status = RequestStatus.FINISHED_LENGTH
                finished.append(req)
        for req in finished:
            self.running.remove(req)
            del self.requests[req.request_id]
            self.kv.free(req)
        return finished
