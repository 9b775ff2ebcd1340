"""An engine request: what the scheduler tracks (vLLM V1's ``Request``)."""

from __future__ import annotations

import bisect
import enum
import sys
from collections.abc import Hashable, Sequence
from typing import Final, Protocol

from servefleet.engine.block_pool import BlockTable
from servefleet.workload.types import Segment, output_key

ALL_BLOCKS: Final = sys.maxsize
"""``Request.shareable_blocks`` of a request whose every block may be looked up."""
# Final: a C static when compiled (a plain module-level name is a dict lookup at each use)
bisect_right: Final = bisect.bisect_right


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED_STOPPED = 3
    FINISHED_LENGTH = 4
    FINISHED_ABORTED = 5

    @property
    def finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED

    @property
    def finish_reason(self) -> str | None:
        return _FINISH_REASONS.get(self)


_FINISH_REASONS: Final = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
}


class TokenContent(Protocol):
    """What the tokens of a request are, as far as prefix caching can tell."""

    def block_content(self, start: int, end: int) -> Hashable:
        """A value equal for equal token runs ``[start, end)`` (prompt then output)."""
        ...

    def block_contents(self, first: int, last: int, size: int) -> list[Hashable]:
        """``block_content`` of blocks ``first`` to ``last - 1`` of ``size`` tokens."""
        ...

    @property
    def output_key(self) -> Hashable | None:
        """A key that only this request's output tokens have in their content (no other
        request's tokens equal them unless its ``prompt_keys`` has it), or None."""
        ...

    @property
    def prompt_keys(self) -> Sequence[Hashable]:
        """The keys the prompt's content is made of (with ``output_key``: a prompt that does
        not have a request's output key has none of its output tokens)."""
        ...

    @property
    def unshared_from(self) -> int | None:
        """Where the request's own content starts, which no other request's prompt will ever
        hold (so no prompt will ever begin with this request's tokens up to there and beyond),
        or None if that is not known."""
        ...


class SegmentContent:
    """Tokens described by segments (the simulator): a token is (segment key, offset).

    Output tokens belong to the segment ``output_key(request_id)``, the key a later turn of a
    session uses for this answer, so history resent by the next turn hits the prefix cache.

    ``never_resent``: no later request resends this request's user segments or its answer (a
    request outside any session, ``RequestSpec.session_id``); its own content then starts at its
    first user segment (``unshared_from``), or at its output if it has none.
    """

    __slots__ = ("_keys", "_num_prompt", "_out_key", "_starts", "unshared_from")

    @property
    def output_key(self) -> str:
        return self._out_key

    @property
    def prompt_keys(self) -> list[str]:
        return self._keys

    def __init__(
        self, segments: Sequence[Segment], request_id: str, never_resent: bool = False
    ) -> None:
        starts, keys, pos = [], [], 0
        own: int | None = None
        for seg in segments:
            if seg.length:
                if own is None and seg.kind == "user":
                    own = pos
                starts.append(pos)
                keys.append(seg.key)
                pos += seg.length
        self._starts = starts
        self._keys = keys
        self._num_prompt = pos
        self._out_key = output_key(request_id)
        self.unshared_from = (pos if own is None else own) if never_resent else None

    def block_content(self, start: int, end: int) -> Hashable:
        num_prompt = self._num_prompt
        if start >= num_prompt:  # all output tokens
            return ((self._out_key, start - num_prompt, end - num_prompt),)
        i = bisect_right(self._starts, start) - 1
        seg_start = self._starts[i]
        seg_end = self._starts[i + 1] if i + 1 < len(self._starts) else num_prompt
        if end <= seg_end:  # inside one segment (the common case)
            return ((self._keys[i], start - seg_start, end - seg_start),)
        return self._pieces(start, end)

    def block_contents(self, first: int, last: int, size: int) -> list[Hashable]:
        """``block_content`` of blocks ``first`` to ``last - 1``, a segment's run of whole
        blocks at a time."""
        out: list[Hashable] = []
        starts, keys, num_prompt = self._starts, self._keys, self._num_prompt
        start, end = first * size, last * size
        while start < end:
            if start >= num_prompt:
                key, p = self._out_key, num_prompt
                out += [((key, s - p, s - p + size),) for s in range(start, end, size)]
                break
            i = bisect_right(starts, start) - 1
            seg_start = starts[i]
            seg_end = starts[i + 1] if i + 1 < len(starts) else num_prompt
            stop = min(end, start + (seg_end - start) // size * size)
            if stop > start:  # whole blocks inside the segment
                key = keys[i]
                out += [
                    ((key, s - seg_start, s - seg_start + size),) for s in range(start, stop, size)
                ]
                start = stop
            else:  # a block across segments
                out.append(self._pieces(start, start + size))
                start += size
        return out

    def _pieces(self, start: int, end: int) -> tuple:
        pieces = []
        pos = start
        while pos < end:
            if pos >= self._num_prompt:
                p = self._num_prompt
                pieces.append((self._out_key, pos - p, end - p))
                break
            i = bisect_right(self._starts, pos) - 1
            seg_start = self._starts[i]
            seg_end = self._starts[i + 1] if i + 1 < len(self._starts) else self._num_prompt
            stop = min(end, seg_end)
            pieces.append((self._keys[i], pos - seg_start, stop - seg_start))
            pos = stop
        return tuple(pieces)


class TokenIdContent:
    """Tokens as real ids (the sim-server): prompt ids, then generated ids appended."""

    __slots__ = ("ids",)

    output_key = None
    """Generated ids may equal any other request's."""
    prompt_keys = ()
    unshared_from = None

    def __init__(self, prompt_ids: Sequence[int]) -> None:
        self.ids = list(prompt_ids)

    def block_content(self, start: int, end: int) -> Hashable:
        return tuple(self.ids[start:end])

    def block_contents(self, first: int, last: int, size: int) -> list[Hashable]:
        ids = self.ids
        return [tuple(ids[i * size : (i + 1) * size]) for i in range(first, last)]


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
        as of (``engine.cruise``); -1 otherwise."""
        self.cruise_event = 0
        self.cruise_tabled = 0
        """While it cruises: the first step whose overflow (if it has one) its block table does
        not count yet (``Cruise.to_table``)."""
        self.private_output = False
        """True while no other request of the engine can hold or look up a block of this
        request's output: its full blocks may then be cached late (``engine.private_output``;
        kept by the scheduler)."""
        self.shareable_blocks = ALL_BLOCKS
        """How many of the request's leading full blocks another request could look up: the
        rest hold its own content (``TokenContent.unshared_from``) and are cached only if it
        is preempted (``engine.private_output``; set by the scheduler)."""

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
