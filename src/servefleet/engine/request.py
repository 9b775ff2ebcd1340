"""An engine request: what the scheduler tracks (vLLM V1's ``Request``)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from servefleet.tokens import SegmentContent, TokenContent, TokenIdContent, extend_block_hashes

__all__ = [
    "Request",
    "RequestStatus",
    "SegmentContent",
    "TokenContent",
    "TokenIdContent",
]


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


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
}


@dataclass(eq=False)
class Request:
    """A request inside one engine.

    ``num_tokens`` (prompt plus output so far) is what must be computed; ``num_computed_tokens``
    catches up with it under the scheduler's token budget. After a preemption the computed
    tokens drop to zero and the output generated so far is recomputed as part of the prompt.
    """

    request_id: str
    num_prompt_tokens: int
    max_tokens: int
    content: TokenContent
    arrival_time: float = 0.0
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int | None = None
    """Prompt tokens the prefix cache served at its first admission (None: not admitted yet)."""
    num_preemptions: int = 0
    num_computed_before_preemption: int = 0
    num_recomputed_tokens: int = 0
    """Tokens computed again after a preemption because the prefix cache no longer held them."""
    first_scheduled_step: int | None = None
    ready_step: int = 0
    """The first engine step that may admit this request (set when it is added)."""
    block_hashes: list[int] = field(default_factory=list)
    """Chained hashes of its full blocks, computed once (``tokens.extend_block_hashes``)."""
    token_runs: list[list[int]] = field(default_factory=list)
    """Runs of consecutive engine steps that emitted a token: ``[first_step, count]``."""
    stop_reason: str | None = None

    def __post_init__(self) -> None:
        if self.num_prompt_tokens < 1:
            raise ValueError(f"request {self.request_id}: a prompt needs at least one token")
        if self.max_tokens < 1:
            raise ValueError(f"request {self.request_id}: max_tokens must be >= 1")

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def is_finished(self) -> bool:
        return self.status.finished

    def ensure_block_hashes(self, num_blocks: int, block_size: int) -> list[int]:
        """Hashes of the first ``num_blocks`` full blocks."""
        return extend_block_hashes(self.content, self.block_hashes, num_blocks, block_size)

    def record_token(self, step: int) -> None:
        runs = self.token_runs
        if runs and runs[-1][0] + runs[-1][1] == step:
            runs[-1][1] += 1
        else:
            runs.append([step, 1])

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, {self.status.name}, computed={self.num_computed_tokens}"
            f"/{self.num_tokens}, out={self.num_output_tokens}/{self.max_tokens})"
        )
