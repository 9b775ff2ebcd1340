"""A request as the fast path tracks it: the plain rule's ``engine.request.Request`` (the same
counters, with the same meaning) and what the shortcuts keep on it (its block table, its cruise,
whether its output is private, how many of its blocks another request could look up)."""

from __future__ import annotations

import sys
from typing import Final

from servefleet.engine.request import RequestStatus
from servefleet.fastpath.block_pool import BlockTable
from servefleet.tokens import TokenContent

ALL_BLOCKS: Final = sys.maxsize
"""``Request.shareable_blocks`` of a request whose every block may be looked up."""


class Request:
    """A request inside one engine.

    ``num_tokens`` (prompt plus output so far) is what must be computed; ``num_computed_tokens``
    catches up with it under the scheduler's token budget. After a preemption the computed
    tokens drop to zero and the output generated so far is recomputed as part of the prompt.
    """

    __slots__ = (
        "arrival_time",
        "block_hashes",
        "block_table",
        "content",
        "cruise_anchor",
        "cruise_event",
        "cruise_tabled",
        "first_scheduled_step",
        "max_tokens",
        "num_cached_tokens",
        "num_computed_before_preemption",
        "num_computed_tokens",
        "num_output_tokens",
        "num_preemptions",
        "num_prompt_tokens",
        "num_recomputed_tokens",
        "num_slots",
        "own_from",
        "private_output",
        "rank",
        "ready_step",
        "request_id",
        "shareable_blocks",
        "status",
        "stop_reason",
        "token_runs",
    )

    def __init__(
        self,
        request_id: str,
        num_prompt_tokens: int,
        max_tokens: int,
        content: TokenContent,
        arrival_time: float = 0.0,
        own_from: int = -1,
    ) -> None:
        if num_prompt_tokens < 1:
            raise ValueError(f"request {request_id}: a prompt needs at least one token")
        if max_tokens < 1:
            raise ValueError(f"request {request_id}: max_tokens must be >= 1")
        self.request_id = request_id
        self.num_prompt_tokens = num_prompt_tokens
        self.max_tokens = max_tokens
        self.content = content
        self.arrival_time = arrival_time
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        self.num_output_tokens = 0
        self.num_cached_tokens: int | None = None
        self.num_preemptions = 0
        self.num_computed_before_preemption = 0
        self.num_slots = 0
        """Tokens the request's KV blocks can hold (kept by the KVCacheManager)."""
        self.num_recomputed_tokens = 0
        self.first_scheduled_step: int | None = None
        self.ready_step = 0
        """The first engine step that may admit this request (set when it is added)."""
        self.block_hashes: list[int] = []
        self.block_table: BlockTable | None = None
        """Its KV blocks while it has some (kept by the ``KVCacheManager``; as nano-vllm's
        ``Sequence.block_table``, not a map by request id: one read, not a lookup)."""
        self.token_runs: list[list[int]] = []
        """Runs of consecutive engine steps that emitted a token: ``[first_step, count]``."""
        self.stop_reason: str | None = None
        self.rank = 0
        """Admission order in the scheduler (``running`` is sorted by it)."""
        self.cruise_anchor = -1
        """While the scheduler advances the request lazily: the step its counters are stored
        as of (``fastpath.cruise``); -1 otherwise."""
        self.cruise_event = 0
        self.cruise_tabled = 0
        """While it cruises: the first step whose overflow (if it has one) its block table does
        not count yet (``Cruise.to_table``)."""
        self.private_output = False
        """True while no other request of the engine can hold or look up a block of this
        request's output: its full blocks may then be cached late (``fastpath.private_output``;
        kept by the scheduler)."""
        self.shareable_blocks = ALL_BLOCKS
        """How many of the request's leading full blocks another request could look up: the
        rest hold its own content (from ``own_from`` on) and are cached only if it is
        preempted (``fastpath.private_output``; set by the scheduler)."""
        self.own_from = own_from
        """Where the content only this request holds starts (``fastpath.contract``); -1:
        none is known."""

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def is_finished(self) -> bool:
        return self.status >= RequestStatus.FINISHED_STOPPED

    def block_hash(self, index: int, block_size: int) -> int:
        """Chained hash of full block ``index`` (computed once, kept)."""
        if index >= len(self.block_hashes):
            self.ensure_block_hashes(index + 1, block_size)
        return self.block_hashes[index]

    def ensure_block_hashes(self, num_blocks: int, block_size: int) -> list[int]:
        """Hashes of the first ``num_blocks`` full blocks (each block's hash chains its parent's)."""
        hashes = self.block_hashes
        have = len(hashes)
        if have >= num_blocks:
            return hashes
        parent = hashes[-1] if hashes else 0
        if num_blocks == have + 1:  # one block (a decode's): no run to build
            content = self.content.block_content(have * block_size, num_blocks * block_size)
            hashes.append(hash((parent, content)))
            return hashes
        for content in self.content.block_contents(have, num_blocks, block_size):
            parent = hash((parent, content))
            hashes.append(parent)
        return hashes

    def record_token(self, step: int) -> None:
        runs = self.token_runs
        if runs:
            last = runs[-1]
            if last[0] + last[1] == step:
                last[1] += 1
                return
        runs.append([step, 1])

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, {self.status.name}, computed={self.num_computed_tokens}"
            f"/{self.num_tokens}, out={self.num_output_tokens}/{self.max_tokens})"
        )
