"""Steady decodes, advanced lazily (the simulator's fast path; results are unchanged).

A running request in a steady decode computes one token and samples one in every step. Step
after step nothing else happens to it until its next *event*: its last token fills a KV block
(the block is cached; not an event while its output is private, ``engine.private_output``: the
blocks it fills are cached when it stops being private or its blocks are freed), its next token
overflows its blocks (one is allocated), or it reaches ``max_tokens``. Between events there is
nothing to decide, so a cruising request is not touched: its counters are kept as of its
``cruise_anchor`` step and are ``stored + (step - anchor)``; ``leave`` brings them up to date
(at its event, or whenever the scheduler needs them).

Steps are counted by the scheduler's ``step_index``; a request cruises only while every step
schedules it, which the scheduler guarantees (it leaves the lazy path, calling ``leave_all``,
for any step that might not: a budget or block shortage).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servefleet.engine.kv_cache_manager import KVCacheManager
    from servefleet.engine.request import Request

NOT_CRUISING = -1


class Cruise:
    __slots__ = ("block_size", "buckets", "caching", "count", "kv", "offset_sum")

    def __init__(self, kv: KVCacheManager) -> None:
        self.kv = kv
        self.block_size = kv.block_size
        self.caching = kv.enable_caching
        self.buckets: dict[int, list[Request]] = {}
        """Step of the next event -> the cruising requests that have it then."""
        self.count = 0
        self.offset_sum = 0
        """Sum over cruising requests of ``num_computed_tokens - cruise_anchor`` (stored values)."""

    def context_sum(self, step: int) -> int:
        """Sum of the computed tokens of every cruising request before ``step``."""
        return self.offset_sum + self.count * step

    def steps_to_event(self, req: Request, computed: int, num_output: int) -> int:
        """Steps until ``req``, in a steady decode with these counters, next needs the
        scheduler: 0 if the coming step is already an event."""
        if num_output == 0:
            return 0  # the first token is reported
        k = req.max_tokens - num_output - 1  # the step that samples the last token
        overflow = req.num_slots - computed  # the step whose token needs a new block
        if overflow < k:
            k = overflow
        if self.caching and not req.private_output:
            fill = -(computed + 1) % self.block_size  # the step whose token fills a block
            if fill < k:
                k = fill
        return k

    def enter(self, req: Request, step: int, last_step: int) -> bool:
        """Let ``req`` cruise from ``step`` on if it is in a steady decode: it sampled in
        ``last_step`` and has exactly one token to compute. False if it must stay active."""
        if req.num_computed_tokens != req.num_prompt_tokens + req.num_output_tokens - 1:
            return False
        runs = req.token_runs
        if not runs or runs[-1][0] + runs[-1][1] != last_step + 1:
            return False
        k = self.steps_to_event(req, req.num_computed_tokens, req.num_output_tokens)
        if k <= 0:
            return False
        req.cruise_anchor = step
        self._book(req, step + k)
        self.count += 1
        self.offset_sum += req.num_computed_tokens - step
        return True

    def _book(self, req: Request, event: int) -> None:
        req.cruise_event = event
        bucket = self.buckets.get(event)
        if bucket is None:
            self.buckets[event] = [req]
        else:
            bucket.append(req)

    def through_block_event(self, req: Request, step: int) -> None:
        """``req``'s token in ``step`` fills or overflows a block: the block's work is done
        (as ``allocate_slots(req, 1)`` would do it, so call this in running order) and its next
        event booked; it keeps cruising."""
        k = step - req.cruise_anchor
        computed = req.num_computed_tokens + k + 1  # after the step
        self.kv.grow_decode(req, computed)
        after = self.steps_to_event(req, computed, req.num_output_tokens + k + 1)
        event = req.cruise_event = step + 1 + after
        bucket = self.buckets.get(event)
        if bucket is None:
            self.buckets[event] = [req]
        else:
            bucket.append(req)

    def expose(self, req: Request, step: int) -> None:
        """``req``'s output is no longer private (between steps, ``step`` coming): the blocks
        it filled are cached now, and from now on a fill is an event."""
        k = step - req.cruise_anchor
        computed = req.num_computed_tokens + k
        self.kv.cache_computed(req, computed)
        event = step + self.steps_to_event(req, computed, req.num_output_tokens + k)
        if event != req.cruise_event:
            self.buckets[req.cruise_event].remove(req)
            self._book(req, event)

    def leave(self, req: Request, step: int) -> None:
        """Bring ``req``'s counters up to ``step`` (before it runs) and stop its cruise."""
        self.count -= 1
        self.offset_sum -= req.num_computed_tokens - req.cruise_anchor
        k = step - req.cruise_anchor
        if k:
            req.num_computed_tokens += k
            req.num_output_tokens += k
            req.token_runs[-1][1] += k
        req.cruise_anchor = NOT_CRUISING

    def drop(self, req: Request, step: int) -> None:
        """``leave``, and forget its event (the request is finished from outside)."""
        self.leave(req, step)
        self.buckets[req.cruise_event].remove(req)

    def due(self, step: int) -> list[Request]:
        """The requests whose event is at ``step``: those that finish then are brought up to
        date (no longer cruising); the others (a block fills or overflows) still cruise."""
        reqs = self.buckets.pop(step, None)
        if reqs is None:
            return []
        for req in reqs:
            if req.num_output_tokens + step - req.cruise_anchor + 1 >= req.max_tokens:
                self.leave(req, step)  # it finishes
        return reqs

    def leave_all(self, reqs: list[Request], step: int) -> None:
        for req in reqs:
            if req.cruise_anchor != NOT_CRUISING:
                self.leave(req, step)
        self.buckets.clear()
