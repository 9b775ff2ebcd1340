"""Steady decodes, advanced lazily (the simulator's fast path; results are unchanged).

A running request in a steady decode computes one token and samples one in every step. Step
after step nothing else happens to it until its next *event*: its last token fills a KV block
(the block is cached; not an event while its output is private, ``fastpath.private_output``: the
blocks it fills are cached when it stops being private or its blocks are freed) or it reaches
``max_tokens``. Between events there is nothing to decide, so a cruising request is not
touched: its counters are kept as of its ``cruise_anchor`` step and are
``stored + (step - anchor)``; ``leave`` brings them up to date (at its event, or whenever the
scheduler needs them).

A token that overflows its request's blocks takes one block from the free queue's head. These
*overflows* are periodic: a request cruising from step ``a`` with ``c`` tokens computed and
``S`` slots overflows in the steps ``a + S - c + j * block_size``, so every cruising request has
a *phase* (that step modulo ``block_size``) and in step ``s`` the requests of phase
``s % block_size`` overflow (``phases``, each in running order). A step counts their blocks out
of the free count at once (``reserve``: the scheduler's check and ``kv_usage`` read only the
count) and the blocks themselves are taken later (``settle``), in the plain order (step by
step; within a step in running order, between the requests the scheduler handles one by one),
before anything reads or changes the free queue or the prefix cache (an allocation, a lookup, a
blocked head's watch, a block freed, cached or touched) or a request leaves the cruise: the
same blocks, evicting the same cached ones, as if each had been taken in its step. A request's
phase never changes while it cruises, and the phases change only when a request enters or
leaves, after a ``settle``: the blocks owed for steps ``s0..s1`` are those of
``phases[s % block_size]`` for each ``s``, with no log per step: ``settle`` counts them
(``sizes``) and touches no request. The blocks are blank (``fastpath.block_pool``: counted, not
named), so a request's table only counts its own; it is told how many when it is next read
(``to_table``: before its blocks are cached or it leaves), from its phase and the steps settled
since it was last told. (A cruising request's ``num_slots`` is kept as of its anchor; ``leave``
sets it from its block table.)

Steps are counted by the scheduler's ``step_index``; a request cruises only while every step
schedules it, which the scheduler guarantees (it leaves the lazy path, calling ``leave_all``,
for any step that might not: a budget or block shortage).
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from servefleet.fastpath.block_pool import BlockTable
    from servefleet.fastpath.kv_cache_manager import KVCacheManager
    from servefleet.fastpath.request import Request

# Final: compiled code reads these as constants (docs/simulate.md, "A compiled core")
heappush: Final = heapq.heappush
heappop: Final = heapq.heappop
NOT_CRUISING: Final = -1


class Cruise:
    __slots__ = (
        "block_size",
        "buckets",
        "caching",
        "count",
        "event_steps",
        "kv",
        "offset_sum",
        "owed_pos",
        "owed_step",
        "phases",
        "sizes",
    )

    def __init__(self, kv: KVCacheManager) -> None:
        self.kv = kv
        self.block_size = kv.block_size
        self.caching = kv.enable_caching
        self.buckets: dict[int, list[Request]] = {}
        """Step of the next event -> the cruising requests that have it then."""
        self.event_steps: list[int] = []
        """A heap of the steps of ``buckets`` (and of some before the coming step, that are
        gone: ``next_event``)."""
        self.count = 0
        self.offset_sum = 0
        """Sum over cruising requests of ``num_computed_tokens - cruise_anchor`` (stored values)."""
        self.phases: list[list[Request]] = [[] for _ in range(self.block_size)]
        """Phase -> the cruising requests that overflow in the steps of that phase, by rank."""
        self.sizes = [0] * self.block_size
        """Phase -> how many requests it has (``overflows``: one short list to read, where the
        phases' lengths are ``block_size`` lists, cold on a large fleet)."""
        self.owed_step = 0
        self.owed_pos = 0
        """The blocks of the overflows before step ``owed_step``, and of the first ``owed_pos``
        requests of its phase, are taken; the rest of the steps reserved are owed."""

    def next_event(self, step: int) -> int:
        """The first step from ``step`` on in which a cruising request has an event (-1:
        none is booked). Every step of the heap from ``step`` on has its bucket: a bucket
        goes only when its step is due (``due`` takes its step off the heap) or with all of
        them (``leave_all``)."""
        heap = self.event_steps
        while heap and heap[0] < step:
            heappop(heap)
        return heap[0] if heap else -1

    def context_sum(self, step: int) -> int:
        """Sum of the computed tokens of every cruising request before ``step``."""
        return self.offset_sum + self.count * step

    def steps_to_event(self, req: Request, computed: int, num_output: int) -> int:
        """Steps until ``req``, in a steady decode with these counters, next needs the
        scheduler: 0 if the coming step is already an event."""
        if num_output == 0:
            return 0  # the first token is reported
        k = req.max_tokens - num_output - 1  # the step that samples the last token
        if self.caching and not req.private_output:
            fill = -(computed + 1) % self.block_size  # the step whose token fills a block
            if fill < k:
                k = fill
        return k

    def enter(self, req: Request, step: int, last_step: int) -> bool:
        """Let ``req`` cruise from ``step`` on if it is in a steady decode: it sampled in
        ``last_step`` and has exactly one token to compute. False if it must stay active.
        Call it between steps (``step`` coming)."""
        computed = req.num_computed_tokens
        if computed != req.num_prompt_tokens + req.num_output_tokens - 1:
            return False
        runs = req.token_runs
        if not runs or runs[-1][0] + runs[-1][1] != last_step + 1:
            return False
        spare = req.num_slots - computed  # its token in step + spare overflows
        if not 0 <= spare < self.block_size:
            return False
        k = self.steps_to_event(req, computed, req.num_output_tokens)
        if k <= 0:
            return False
        self.settle(step)
        assert self.owed_pos == 0, "a request starts cruising inside a step settled in part"
        req.cruise_anchor = step
        req.cruise_tabled = step
        self._book(req, step + k)
        self.count += 1
        self.offset_sum += computed - step
        p = (step + spare) % self.block_size
        phase = self.phases[p]
        i = len(phase)
        while i and phase[i - 1].rank > req.rank:
            i -= 1
        phase.insert(i, req)
        self.sizes[p] += 1
        return True

    def _book(self, req: Request, event: int) -> None:
        req.cruise_event = event
        bucket = self.buckets.get(event)
        if bucket is None:
            self.buckets[event] = [req]
            heappush(self.event_steps, event)
        else:
            bucket.append(req)

    def overflows(self, step: int) -> int:
        """How many cruising requests' tokens overflow their blocks in ``step`` (each takes a
        block)."""
        return self.sizes[step % self.block_size]

    def reserve(self, step: int) -> None:
        """``step`` is scheduled the lazy way: count out the blocks of its overflows (the
        scheduler checked that they are free)."""
        self.kv.block_pool.reserve(self.sizes[step % self.block_size])

    def settle(self, step: int, rank: int = -1) -> None:
        """Take the blocks owed for the overflows of the steps before ``step``, and of those
        in ``step`` of the requests ranked up to ``rank``, in the plain order (fresh blocks are
        blank, ``fastpath.block_pool``: which request gets which does not matter, only how many
        leave the queue's head). The requests' tables learn of theirs later (``to_table``)."""
        t, pos = self.owed_step, self.owed_pos
        if t > step:
            return
        if not self.count:
            self.owed_step, self.owed_pos = step, 0
            return
        sizes, bs = self.sizes, self.block_size
        n = 0
        if pos and t < step:  # the rest of a step begun
            n += sizes[t % bs] - pos
            t += 1
            pos = 0
        cycles = (step - t) // bs
        if cycles:  # whole steps, block_size at a time: each overflows once a cycle
            n += self.count * cycles
            t += cycles * bs
        while t < step:
            n += sizes[t % bs]
            t += 1
        if rank >= 0:
            group = self.phases[t % bs]
            end = pos
            while end < len(group) and group[end].rank <= rank:
                end += 1
            n += end - pos
            pos = end
        self.owed_step, self.owed_pos = t, pos
        if n:
            self.kv.block_pool.take(n)

    def through_fill(self, req: Request, step: int) -> None:
        """``req``'s token in ``step`` fills a block: the block is cached (as
        ``allocate_slots(req, 1)`` would do it, so call this in running order) and its next
        event booked; it keeps cruising."""
        self.settle(step, req.rank)
        self.to_table(req)
        k = step - req.cruise_anchor
        computed = req.num_computed_tokens + k + 1  # after the step
        self.kv.cache_computed(req, computed)
        after = self.steps_to_event(req, computed, req.num_output_tokens + k + 1)
        self._book(req, step + 1 + after)

    def expose(self, req: Request, step: int) -> None:
        """``req``'s output is no longer private (between steps, ``step`` coming): the blocks
        it filled are cached now, and from now on a fill is an event."""
        self.settle(step)
        self.to_table(req)
        k = step - req.cruise_anchor
        computed = req.num_computed_tokens + k
        self.kv.cache_computed(req, computed)
        event = step + self.steps_to_event(req, computed, req.num_output_tokens + k)
        if event != req.cruise_event:
            self.buckets[req.cruise_event].remove(req)
            self._book(req, event)

    def _phase(self, req: Request) -> int:
        """The phase of cruising ``req`` (from its counters as of its anchor)."""
        return (req.cruise_anchor + req.num_slots - req.num_computed_tokens) % self.block_size

    def to_table(self, req: Request) -> BlockTable:
        """Count in cruising ``req``'s block table the blocks its overflows took so far
        (``settle``): those of the steps of its phase from ``cruise_tabled`` on, up to the
        settled one, and in that step if its turn there has come. Returns the table."""
        table = req.block_table
        assert table is not None, "a cruising request has blocks"
        p, bs = self._phase(req), self.block_size
        end, pos = self.owed_step, self.owed_pos
        if pos and end % bs == p and req.rank <= self.phases[p][pos - 1].rank:
            end += 1
        start = req.cruise_tabled
        if end > start:
            table.blank += (end - 1 - p) // bs - (start - 1 - p) // bs
            req.cruise_tabled = end
        return table

    def tables_settled(self) -> None:
        """Every cruising request's block table counts the blocks settled so far (for a
        caller that reads the tables, e.g. a test)."""
        for phase in self.phases:
            for req in phase:
                self.to_table(req)

    def _catch_up(self, req: Request, step: int) -> None:
        """Bring ``req``'s counters and block table up to ``step`` (before it runs, settled);
        it no longer cruises."""
        table = self.to_table(req)
        k = step - req.cruise_anchor
        if k:
            req.num_computed_tokens += k
            req.num_output_tokens += k
            req.token_runs[-1][1] += k
        req.num_slots = table.num_blocks * self.block_size
        req.cruise_anchor = NOT_CRUISING

    def leave(self, req: Request, step: int) -> None:
        """Stop ``req``'s cruise between steps (``step`` coming), its blocks and counters up to
        date."""
        self.settle(step)
        self.count -= 1
        self.offset_sum -= req.num_computed_tokens - req.cruise_anchor
        p = self._phase(req)
        self._catch_up(req, step)  # before it leaves its phase (its turn is by rank in it)
        self.phases[p].remove(req)
        self.sizes[p] -= 1

    def drop(self, req: Request, step: int) -> None:
        """``leave``, and forget its event (the request is finished from outside)."""
        self.leave(req, step)
        self.buckets[req.cruise_event].remove(req)

    def due(self, step: int) -> list[Request]:
        """The requests whose event is at ``step``: those that finish then are brought up to
        date (no longer cruising); the others (a block fills) still cruise."""
        heap = self.event_steps
        while heap and heap[0] <= step:
            heappop(heap)
        reqs = self.buckets.pop(step, None)
        if reqs is None:
            return []
        for req in reqs:
            if req.num_output_tokens + step - req.cruise_anchor + 1 >= req.max_tokens:
                self.leave(req, step)  # it finishes
        return reqs

    def leave_all(self, reqs: list[Request], step: int) -> None:
        """Every request stops cruising, between steps (``step`` coming)."""
        self.settle(step)
        for req in reqs:
            if req.cruise_anchor != NOT_CRUISING:
                self._catch_up(req, step)
        self.count = self.offset_sum = 0
        self.buckets.clear()
        self.event_steps.clear()
        for phase in self.phases:
            phase.clear()
        self.sizes = [0] * self.block_size
