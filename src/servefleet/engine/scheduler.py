"""vLLM V1 scheduling under a token budget.

The one rule: every request has ``num_tokens`` (prompt + output so far) and
``num_computed_tokens``; each step the scheduler lets computed tokens catch up with total tokens
under one budget of ``max_num_batched_tokens`` shared by decodes and (chunked) prefills, running
requests first, then waiting ones.

With async scheduling (vLLM's default since 0.12) the engine core schedules step k+1 right after
it launches step k, before a request that arrives during step k can be seen; so such a request
is admitted in step k+2 at the earliest, unless step k+1 has nothing else to run (then the
engine core waits for step k and schedules the new request with it). A request that arrives at
an idle engine is admitted at once. Under load this costs a new request up to one more step of
queueing, a long one when the steps carry prefill chunks (docs/validation.md).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from servefleet.engine.config import SchedulerConfig
from servefleet.engine.kv_cache_manager import KVCacheManager
from servefleet.engine.request import Request, RequestStatus


@dataclass(slots=True)
class SchedulerOutput:
    """What one step computes: requests and their token counts, and the batch's shape."""

    reqs: list[Request] = field(default_factory=list)
    num_scheduled: list[int] = field(default_factory=list)
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
    """Requests that got their first output token in this step (set by update_from_output)."""

    @property
    def num_seqs(self) -> int:
        return len(self.reqs)

    @property
    def is_decode_only(self) -> bool:
        return not self.prefill_chunks


class Scheduler:
    __slots__ = ("config", "in_flight", "kv", "requests", "running", "step_index", "waiting")

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.kv = KVCacheManager(
            config.num_gpu_blocks, config.block_size, config.enable_prefix_caching
        )
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.step_index = 0
        self.in_flight = False
        """A step has been scheduled and the next ``schedule()`` call has not come yet."""

    # -- queue -----------------------------------------------------------------------------
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

    # -- the step --------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """Running requests first (preempting the newest when blocks run out), then waiting
        ones while budget, sequence slots and blocks last; no admissions in a step that
        preempted."""
        out = SchedulerOutput()
        budget = self._schedule_running(out, self.config.max_num_batched_tokens)
        if not out.preempted:
            self._schedule_waiting(out, budget)
        if out.reqs:
            self.step_index += 1
        self.in_flight = bool(out.reqs)
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        kv, running = self.kv, self.running
        bs, caching = kv.block_size, kv.enable_caching
        reqs_append, nsched_append, chunks = (
            out.reqs.append,
            out.num_scheduled.append,
            out.prefill_chunks,
        )
        num_tokens = num_sampled = num_decodes = decode_context = 0
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            computed = req.num_computed_tokens
            n = req.num_prompt_tokens + req.num_output_tokens - computed
            if n > budget:
                n = budget
            total = computed + n
            # Fast path (most decodes): the tokens fit in the request's blocks and fill no
            # block, so there is nothing to allocate or cache.
            if total > req.num_slots or (caching and total % bs == 0):
                preempted_self = False
                while not kv.allocate_slots(req, n):
                    victim = running.pop()
                    self._preempt(victim, out)
                    if victim is req:
                        preempted_self = True
                        break
                if preempted_self:
                    break
            # record it (inlined _add_scheduled: this loop runs once per running request)
            reqs_append(req)
            nsched_append(n)
            budget -= n
            num_tokens += n
            if total == req.num_prompt_tokens + req.num_output_tokens:
                num_sampled += 1
                if n == 1:
                    num_decodes += 1
                    decode_context += total
                else:
                    chunks.append((n, computed))
            else:
                chunks.append((n, computed))
            req.num_computed_tokens = total
            i += 1
        out.num_tokens += num_tokens
        out.num_sampled += num_sampled
        out.num_decodes += num_decodes
        out.decode_context += decode_context
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
        cfg, kv, waiting, running = self.config, self.kv, self.waiting, self.running
        step = self.step_index
        while waiting and budget > 0 and len(running) < cfg.max_num_seqs:
            req = waiting[0]
            if req.ready_step > step and out.reqs:
                break  # arrived after this step was scheduled; later ones too (FIFO)
            hit_blocks, num_hit = kv.get_computed_blocks(req)
            n = min(req.num_tokens - num_hit, budget)
            if not kv.allocate_slots(req, n, hit_blocks, num_hit):
                break
            waiting.popleft()
            kv.record_prefix_stats(req, num_hit)
            if req.num_cached_tokens is None:
                req.num_cached_tokens = num_hit
                req.first_scheduled_step = self.step_index
            else:  # resumed after preemption: what is not found again is computed twice
                req.num_recomputed_tokens += max(0, req.num_computed_before_preemption - num_hit)
            req.num_computed_tokens = num_hit
            req.status = RequestStatus.RUNNING
            running.append(req)
            self._add_scheduled(out, req, n)
            budget -= n

    @staticmethod
    def _add_scheduled(out: SchedulerOutput, req: Request, n: int) -> None:
        computed = req.num_computed_tokens
        out.reqs.append(req)
        out.num_scheduled.append(n)
        out.num_tokens += n
        if computed + n == req.num_prompt_tokens + req.num_output_tokens:
            out.num_sampled += 1
            if n == 1:
                out.num_decodes += 1
                out.decode_context += computed + 1
                req.num_computed_tokens = computed + 1
                return
        out.prefill_chunks.append((n, computed))
        req.num_computed_tokens = computed + n

    # -- after the step --------------------------------------------------------------------
    def update_from_output(self, out: SchedulerOutput, step: int) -> list[Request]:
        """Append the sampled token of every request that caught up; finish those that reached
        ``max_tokens``. Returns the requests that finished."""
        finished: list[Request] = []
        for req in out.reqs:
            if req.num_computed_tokens != req.num_prompt_tokens + req.num_output_tokens:
                continue  # a partial prefill samples nothing
            req.num_output_tokens += 1
            if req.num_output_tokens == 1:
                out.first_tokens.append(req)
            runs = req.token_runs  # inlined Request.record_token
            if runs and runs[-1][0] + runs[-1][1] == step:
                runs[-1][1] += 1
            else:
                runs.append([step, 1])
            if req.num_output_tokens >= req.max_tokens:
                req.status = RequestStatus.FINISHED_LENGTH
                finished.append(req)
        if finished:
            self.running = [r for r in self.running if not r.is_finished]
            for req in finished:
                del self.requests[req.request_id]
                self.kv.free(req)
        return finished
