"""The request a workload asks for, in a form both worlds understand: its prompt is a sequence
of segments (``servefleet.tokens``), which the simulator hashes into KV blocks and the live
benchmark renders into text."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from servefleet.tokens import Segment, SegmentKind, output_key

__all__ = ["Load", "RequestSpec", "Segment", "SegmentKind", "WorkloadSource", "output_key"]


@dataclass(slots=True)
class RequestSpec:
    """One request the workload wants sent.

    ``arrival_time`` is in seconds since the start of the run (absolute schedule, never relative
    to the previous send). ``max_tokens`` is the output length the workload asks for; the request
    is sent with ``ignore_eos`` so that it is also the length generated unless a stop applies.

    Only a session resends content: a request with no ``session_id`` owns its user message
    (keyed ``tokens.user_key(request_id)``) and its answer, which no other request's prompt may
    hold; its ``system`` and ``block`` segments may be in any prompt. The simulator's fast path
    then never caches the KV blocks of its own content, which no lookup could find; a prompt
    that resends it fails (``fastpath.contract``).
    """

    request_id: str
    class_name: str
    prompt: tuple[Segment, ...]
    max_tokens: int
    arrival_time: float
    session_id: str | None = None
    user_id: str | None = None
    turn: int = 0

    @property
    def prompt_tokens(self) -> int:
        return sum(s.length for s in self.prompt)


class WorkloadSource(Protocol):
    """When to send what: a pure object (no clock, no I/O) that both the simulator and the live
    benchmark drive.

    ``initial()`` yields the requests known up front, in non-decreasing ``arrival_time`` (it may
    be infinite: the runner decides when to stop). ``on_finish`` is called once per finished
    request with the time it finished and the output tokens actually received; it returns the
    requests that this completion releases (the next turn of a session after its think time; the
    replacement in a closed loop), each with its absolute ``arrival_time``.
    """

    def initial(self): ...  # -> Iterator[RequestSpec]

    def on_finish(
        self, spec: RequestSpec, finish_time: float, output_tokens: int
    ) -> list[RequestSpec]: ...


@dataclass(frozen=True, slots=True)
class Load:
    """How hard a run drives a workload: a closed loop of ``concurrency`` users, or open-loop
    arrivals at ``rate`` requests/s. Shared by the simulator and the live benchmark, so that
    their points line up."""

    concurrency: int | None = None
    rate: float | None = None

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError("a load point is either a concurrency or a rate")

    @property
    def label(self) -> str:
        return f"c={self.concurrency}" if self.concurrency is not None else f"{self.rate:g} req/s"

    @property
    def tag(self) -> str:
        """File-name tag: ``c8``, ``r2.5``."""
        return f"c{self.concurrency}" if self.concurrency is not None else f"r{self.rate:g}"

    @property
    def value(self) -> float:
        if self.concurrency is not None:
            return float(self.concurrency)
        assert self.rate is not None  # __post_init__: exactly one of the two is set
        return float(self.rate)

    def to_dict(self) -> dict:
        return {"concurrency": self.concurrency, "rate": self.rate}
