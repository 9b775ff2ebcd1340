"""The fast path's scheduler: ``engine.scheduler``'s rule (the same batches, the same blocks
and counters at every step: ``tests/test_scheduler_lazy.py``), doing less work per step.

With lazy decodes (``enable_lazy_decodes``, used by the fleet simulator) a step in which every
running request gets all the tokens it asks for, with no block shortage, touches only the
requests that need it (``fastpath.cruise``): those prefilling, and steady decodes at an event.
The schedule is the same; a cruising request's counters are brought up to date by ``sync``.
With prefix caching, the blocks a request fills while its output is private
(``fastpath.private_output``) are cached late, in one run: no block fill is then an event; those
holding content the request owns (``fastpath.contract``) are not cached unless it is preempted.
Nor is an overflow: a step counts the blocks of the cruising requests whose token overflows out of the
free count, and ``Cruise.settle`` takes them later, in the plain order, before anything reads or
changes the free queue or the cache (``fastpath.cruise``).
"""

from __future__ import annotations

from collections import deque
from operator import attrgetter
from typing import Final

from servefleet.engine.config import SchedulerConfig
from servefleet.engine.request import RequestStatus
from servefleet.fastpath.cruise import NOT_CRUISING, Cruise
from servefleet.fastpath.kv_cache_manager import KVCacheManager
from servefleet.fastpath.private_output import PrivateOutputs
from servefleet.fastpath.request import Request


class SchedulerOutput:
    """What one step computes: requests and their token counts, and the batch's shape.

    A plain class with its own ``__init__``, not a dataclass (docs/simulate.md, "A compiled
    core")."""

    __slots__ = (
        "decode_context",
        "first_tokens",
        "num_decodes",
        "num_sampled",
        "num_seqs",
        "num_tokens",
        "preempted",
        "prefill_chunks",
        "reqs",
        "updated",
        "updated_n",
    )

    def __init__(self) -> None:
        self.reqs: list[Request] | None = []
        """Every request scheduled: running ones in order, then those admitted (None: not
        listed, ``Scheduler.enable_lazy_decodes(step_requests=False)``)."""
        self.num_seqs = 0
        """How many requests were scheduled."""
        self.updated: list[Request] = []
        """The requests advanced one by one, in the same order; with lazy decodes the others
        are steady decodes that compute and sample one token each (else the same list as
        ``reqs``)."""
        self.updated_n: list[int] = []
        """Tokens scheduled for each of ``updated``."""
        self.preempted: list[Request] = []
        self.num_tokens = 0
        self.num_decodes = 0
        self.decode_context = 0
        """Sum over decodes of the context each attends to (KV tokens read)."""
        self.prefill_chunks: list[tuple[int, int]] = []
        """(new tokens, tokens already computed) for every non-decode request."""
        self.num_sampled = 0
        """Requests whose computed tokens reach their total: they sample a token this step."""
        self.first_tokens: list[Request] = []
        """Requests that got their first output token in this step (set by
        update_from_output)."""

    @property
    def num_scheduled(self) -> list[int]:
        """Tokens scheduled for each of ``reqs``."""
        assert self.reqs is not None, "the step's requests were not listed"
        if self.updated is self.reqs:
            return list(self.updated_n)
        n_of = {id(r): n for r, n in zip(self.updated, self.updated_n, strict=True)}
        return [n_of.get(id(r), 1) for r in self.reqs]

    @property
    def is_decode_only(self) -> bool:
        return not self.prefill_chunks


# Final: compiled code reads these as constants (docs/simulate.md, "A compiled core")
_RANK: Final = attrgetter("rank")
FEW_FINISHED: Final = 8
"""Up to this many requests finishing in a step are taken out of ``running`` one by one."""


class Scheduler:
    __slots__ = (
        "_blocked",
        "_next_rank",
        "_running_shared",
        "_step_requests",
        "active",
        "config",
        "cruise",
        "in_flight",
        "kv",
        "private",
        "requests",
        "running",
        "step_index",
        "waiting",
    )

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.kv = KVCacheManager(
            config.num_gpu_blocks, config.block_size, config.enable_prefix_caching
        )
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._running_shared = False
        """``running`` is also a step's ``out.reqs`` (a lazy step's: no copy per step, which
        would touch every running request's object); ``_own_running`` copies it before it
        changes."""
        self._step_requests = True
        """Whether a lazy step's output lists its requests (``enable_lazy_decodes``)."""
        self.requests: dict[str, Request] = {}
        self.step_index = 0
        self.in_flight = False
        """A step has been scheduled and the next ``schedule()`` call has not come yet."""
        self._next_rank = 0
        self._blocked: tuple[Request, int] | None = None
        """The queue head that could not be admitted last time, and the budget it had."""
        self.cruise: Cruise | None = None
        """Set by ``enable_lazy_decodes``: the running requests in a steady decode."""
        self.active: list[Request] = []
        """With lazy decodes, the running requests that do not cruise (in running order)."""
        self.private: PrivateOutputs | None = None
        """With lazy decodes and prefix caching: which requests' outputs are private."""

    # -- lazy decodes ----------------------------------------------------------------------
    def enable_lazy_decodes(self, step_requests: bool = True) -> None:
        """Advance steady decodes lazily from now on: same schedule, less work per step; a
        running request's counters and token runs are then up to date only after ``sync``.
        ``step_requests=False``: a lazy step's output does not list its requests (``reqs`` is
        None, ``num_seqs`` counts them), for a caller that reads only counts: ``running`` is
        then never copied for an output (a copy touches every running request's object)."""
        self._step_requests = step_requests
        if self.cruise is None:
            self.cruise = Cruise(self.kv)
            self.active = list(self.running)
            if self.kv.enable_caching:
                self.private = PrivateOutputs()
                for req in self.requests.values():
                    self.private.add(req, may_be_private=False)

    def sync(self) -> None:
        """Bring every running request's counters up to date (call it between steps)."""
        if self.cruise is not None:
            self.cruise.leave_all(self.running, self.step_index)
            self.active = list(self.running)

    def _own_running(self) -> list[Request]:
        """``running``, to change in place: copied first if a step's ``out.reqs`` is it."""
        if self._running_shared:
            self.running = self.running.copy()
            self._running_shared = False
        return self.running

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
        if self.private is not None:
            for owner in self.private.add(req):
                self._expose(owner)
            if req.own_from >= 0:
                req.shareable_blocks = req.own_from // self.kv.block_size

    def _expose(self, req: Request) -> None:
        """``req``'s output stopped being private: cache the blocks it filled (between steps)."""
        if req.status != RequestStatus.RUNNING:
            return  # no blocks yet
        assert self.cruise is not None
        if req.cruise_anchor == NOT_CRUISING:
            self.cruise.settle(self.step_index)
            self.kv.cache_computed(req, req.num_computed_tokens)
        else:
            self.cruise.expose(req, self.step_index)

    def finish_request(self, request_id: str, status: RequestStatus) -> Request | None:
        """Finish (e.g. abort) a request now; frees its blocks. None if unknown/finished."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return None
        if req.status == RequestStatus.RUNNING:
            if self.cruise is not None:
                self.cruise.settle(self.step_index)
                if req.cruise_anchor == NOT_CRUISING:
                    self.active.remove(req)
                else:
                    self.cruise.drop(req, self.step_index)
            self._own_running().remove(req)
        else:
            self.waiting.remove(req)
        req.status = status
        self.kv.free(req)
        if self.private is not None:
            self.private.remove(req)
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
        budget = self.config.max_num_batched_tokens
        cruise = self.cruise
        specials = self._steady_specials(budget) if cruise is not None else None
        if specials is None or cruise is None:
            self.sync()
            self._own_running()
            budget = self._schedule_running(out, budget)
            if not out.preempted:
                self._schedule_waiting(out, budget)
            out.num_seqs = len(out.updated)
            out.reqs = out.updated if self._step_requests else None
            if self.cruise is not None:
                self.active = list(self.running)
        else:
            num_running = len(self.running)
            budget = self._schedule_steady(out, specials, budget)
            if self.waiting:
                cruise.settle(self.step_index + 1)  # admissions read the queue and cache
                self._schedule_waiting(out, budget)
            out.num_seqs = len(self.running)
            if self._step_requests:
                out.reqs = self.running
                self._running_shared = True
            else:
                out.reqs = None
            active = [r for r in specials if r.cruise_anchor == NOT_CRUISING]
            self.active = active + self.running[num_running:]
        if out.num_seqs:
            self.step_index += 1
        self.in_flight = out.num_seqs > 0
        return out

    def _steady_specials(self, budget: int) -> list[Request] | None:
        """With lazy decodes: the requests to handle one by one in this step, in running order,
        if every running request gets all the tokens it asks for and no block allocation can
        fail (so each cruising request computes and samples one token); None if the step may
        not be so. Cruising ones among them have a block event."""
        cruise, step = self.cruise, self.step_index
        assert cruise is not None
        due = cruise.due(step)
        specials = sorted(self.active + due, key=_RANK) if due else self.active
        demand = cruise.count
        blocks = 0
        bs = self.kv.block_size
        for req in specials:
            if req.cruise_anchor != NOT_CRUISING:  # a block fills: its overflows are phased
                continue
            total = req.num_prompt_tokens + req.num_output_tokens
            demand += total - req.num_computed_tokens
            if total > req.num_slots:
                blocks += -(-total // bs) - req.num_slots // bs
        blocks += cruise.overflows(step)  # the cruising requests whose token overflows
        if demand > budget or blocks > self.kv.block_pool.num_free_blocks:
            return None
        return specials

    def _schedule_steady(self, out: SchedulerOutput, specials: list[Request], budget: int) -> int:
        """Schedule all running requests, each for all its tokens (``_steady_specials`` said
        that fits); only ``specials`` are touched."""
        kv, cruise, step = self.kv, self.cruise, self.step_index
        assert cruise is not None
        bs, caching = kv.block_size, kv.enable_caching
        cruise.reserve(step)
        for req in specials:
            if req.cruise_anchor != NOT_CRUISING:  # a block fills
                cruise.through_fill(req, step)
                continue
            computed = req.num_computed_tokens
            n = req.num_prompt_tokens + req.num_output_tokens - computed
            total = computed + n
            if total > req.num_slots or (caching and total % bs == 0):
                cruise.settle(step, req.rank)  # the overflows before it take their blocks
                if not kv.allocate_slots(req, n):
                    raise RuntimeError(f"{req!r}: no blocks in a step checked to have enough")
            self._add_scheduled(out, req, n)
            budget -= n
        k = cruise.count
        if k:
            out.num_tokens += k
            out.num_sampled += k
            out.num_decodes += k
            out.decode_context += cruise.context_sum(step) + k
            budget -= k
        return budget

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        kv, running = self.kv, self.running
        bs, caching = kv.block_size, kv.enable_caching
        updated, updated_n, chunks = out.updated, out.updated_n, out.prefill_chunks
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
            updated.append(req)
            updated_n.append(n)
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
        self.kv.free(req, preempted=True)
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
            if req.ready_step > step and out.num_tokens:
                break  # arrived after this step was scheduled; later ones too (FIFO)
            blocked = self._blocked
            if blocked and blocked[0] is req and budget >= blocked[1] and kv.still_blocked():
                # It would fail again: nothing that could let it in has changed. vLLM looks
                # it up (and counts the lookup) all the same.
                kv.record_lookup(req, kv.blocked_hits())
                break
            hit_blocks, num_hit = kv.get_computed_blocks(req)
            kv.record_lookup(req, num_hit)
            n = min(req.num_tokens - num_hit, budget)
            if not kv.allocate_slots(req, n, hit_blocks, num_hit):
                kv.note_blocked(req, hit_blocks, budget)
                self._blocked = (req, budget)
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
            req.rank = self._next_rank
            self._next_rank += 1
            running = self._own_running()
            running.append(req)
            self._add_scheduled(out, req, n)
            budget -= n

    @staticmethod
    def _add_scheduled(out: SchedulerOutput, req: Request, n: int) -> None:
        computed = req.num_computed_tokens
        out.updated.append(req)
        out.updated_n.append(n)
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

    # -- quiet steps -----------------------------------------------------------------------
    def quiet_steps(self, limit: int) -> int:
        """How many of the coming steps (up to ``limit``) are *quiet* if no request is added:
        with lazy decodes, every running request cruises and has no event in them, none
        waiting can be admitted (async scheduling: it came during the step in flight), and
        the overflows' blocks are free. Such a step is the lazy one with nothing to touch:
        every running request computes and samples one token, none finishes; only the step
        index, the blocks counted out and the decodes' context change, so its duration is
        known ahead (``Engine.quiet_durations``) and ``quiet_step`` runs it."""
        cruise = self.cruise
        if cruise is None or self.active or not self.running:
            return 0
        if cruise.count > self.config.max_num_batched_tokens:
            return 0
        k = self.still_quiet(limit)
        step, free = self.step_index, self.kv.block_pool.num_free_blocks
        for j in range(k):
            free -= cruise.overflows(step + j)
            if free < 0:
                return j
        return k

    def still_quiet(self, steps: int) -> int:
        """How many of the next ``steps`` steps come before a cruising request's event and
        before the step the waiting queue's head may join: ``quiet_steps``'s horizon, and,
        after a request was added, how many of the quiet steps planned still are (it may be
        the head, or bring a cruising request's event sooner: ``_expose``; the blocks they
        need are still free, nothing was allocated)."""
        assert self.cruise is not None
        step = self.step_index
        event = self.cruise.next_event(step)
        if 0 <= event < step + steps:
            steps = event - step
        if self.waiting and self.waiting[0].ready_step < step + steps:
            steps = max(0, self.waiting[0].ready_step - step)
        return steps

    def quiet_step(self) -> None:
        """Schedule and run the coming step, which ``quiet_steps`` said is quiet: the same as
        ``schedule`` and ``update_from_output`` would do, with no output to read."""
        assert self.cruise is not None
        self.cruise.reserve(self.step_index)
        self.step_index += 1
        self.in_flight = True

    # -- after the step --------------------------------------------------------------------
    def update_from_output(self, out: SchedulerOutput, step: int) -> list[Request]:
        """Append the sampled token of every request that caught up; finish those that reached
        ``max_tokens``. Returns the requests that finished."""
        finished: list[Request] = []
        for req in out.updated:
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
            if self.cruise is not None:
                self.cruise.settle(self.step_index)
            if len(finished) <= FEW_FINISHED:
                running = self._own_running()
                for req in finished:  # a scan in C each, no call per running request
                    running.remove(req)
            else:
                self.running = [r for r in self.running if not r.is_finished]
                self._running_shared = False
            for req in finished:
                del self.requests[req.request_id]
                self.kv.free(req)
                if self.private is not None:
                    self.private.remove(req)
        if self.cruise is not None:
            self._start_cruising(step)
        return finished

    def _start_cruising(self, last_step: int) -> None:
        """Active requests that are now in a steady decode start cruising."""
        cruise, step = self.cruise, self.step_index
        assert cruise is not None
        active = []
        for req in self.active:
            if req.status == RequestStatus.RUNNING and not cruise.enter(req, step, last_step):
                active.append(req)
        self.active = active
