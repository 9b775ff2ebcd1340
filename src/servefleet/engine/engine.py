"""One replica's engine: scheduler + KV cache + cost model, with no clock of its own.

``step()`` schedules a batch, advances every scheduled request as the GPU would, and returns
how long the step takes; the caller (a simulated clock, or the sim-server's wall clock)
delivers the step's tokens when that time has passed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from servefleet.engine.config import SchedulerConfig
from servefleet.engine.request import Request, RequestStatus
from servefleet.engine.scheduler import Scheduler, SchedulerOutput

if TYPE_CHECKING:
    from servefleet.engine.cost_model import CostModel


@dataclass
class StepResult:
    """One step: its index and duration, what it computed, the requests that finished, and
    the engine's state after it."""

    step: int
    duration: float
    output: SchedulerOutput
    finished: list[Request]
    kv_usage: float
    num_running: int
    num_waiting: int


@dataclass(slots=True)
class EngineCounters:
    """Monotonic totals, in vLLM's metric units."""

    steps: int = 0
    busy_time: float = 0.0
    prefill_tokens: int = 0
    """Tokens computed by prefill chunks (recomputation after preemption included)."""
    generation_tokens: int = 0
    preemptions: int = 0
    finished: int = 0
    aborted: int = 0


def validate_request(
    config: SchedulerConfig, num_prompt_tokens: int, max_tokens: int
) -> str | None:
    """Why a request can't be served (as vLLM words it), or None if it can."""
    limit = config.max_model_len
    if num_prompt_tokens + max_tokens > limit:
        return (
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{num_prompt_tokens + max_tokens} tokens ({num_prompt_tokens} in the messages, "
            f"{max_tokens} in the completion). Please reduce the length of the messages or completion."
        )
    if -(-(num_prompt_tokens + max_tokens) // config.block_size) > config.num_gpu_blocks:
        return f"request needs more KV blocks than the {config.num_gpu_blocks} the GPU holds"
    return None


class Engine:
    def __init__(self, config: SchedulerConfig, cost: CostModel) -> None:
        self.config = config
        self.cost = cost
        self.scheduler = Scheduler(config)
        self.counters = EngineCounters()

    def validate(self, num_prompt_tokens: int, max_tokens: int) -> str | None:
        """Why a request can't be served (as vLLM words it), or None if it can."""
        return validate_request(self.config, num_prompt_tokens, max_tokens)

    def add_request(self, req: Request) -> None:
        self.scheduler.add_request(req)

    def abort_request(self, request_id: str) -> Request | None:
        req = self.scheduler.finish_request(request_id, RequestStatus.FINISHED_ABORTED)
        if req is not None:
            self.counters.aborted += 1
        return req

    def stop_request(self, request_id: str) -> Request | None:
        """Finish a request early because a stop condition matched (finish_reason "stop")."""
        req = self.scheduler.finish_request(request_id, RequestStatus.FINISHED_STOPPED)
        if req is not None:
            self.counters.finished += 1
        return req

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished

    @property
    def step_index(self) -> int:
        """The index of the next step to be scheduled."""
        return self.scheduler.step_index

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def kv_usage(self) -> float:
        return self.scheduler.kv.usage

    def step(self, from_idle: bool = False) -> StepResult | None:
        """Run one step; None when there is nothing that can run. ``from_idle``: no step was
        running when this one was scheduled, so its host work cannot hide behind the GPU's."""
        sched = self.scheduler
        step = sched.step_index
        out = sched.schedule()
        if not out.num_seqs:
            return None
        duration = self.cost.step_time(
            out.num_tokens,
            out.num_seqs,
            out.num_decodes,
            out.decode_context,
            out.prefill_chunks,
            out.num_sampled,
            from_idle,
        )
        finished = sched.update_from_output(out, step)
        c = self.counters
        c.steps += 1
        c.busy_time += duration
        c.prefill_tokens += out.num_tokens - out.num_decodes
        c.generation_tokens += out.num_sampled
        c.preemptions += len(out.preempted)
        c.finished += len(finished)
        return StepResult(
            step, duration, out, finished, sched.kv.usage, len(sched.running), len(sched.waiting)
        )
