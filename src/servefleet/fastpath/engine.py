"""The fast path's engine: ``engine.engine.Engine``'s steps (the same durations, counters and
finished requests) over the fast scheduler, with lazy decodes always on, and its *quiet* steps
(nothing but steady decodes: ``quiet_durations``, ``quiet_step``) run with no output to read.
It is what ``sim.replicas.ReplicaEngine`` asks of an engine: ``ClusterSim`` drives it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from servefleet.engine.config import SchedulerConfig
from servefleet.engine.engine import EngineCounters, validate_request
from servefleet.engine.kv_cache_manager import PrefixCacheStats
from servefleet.engine.request import RequestStatus
from servefleet.fastpath.contract import OwnContent
from servefleet.fastpath.request import Request
from servefleet.fastpath.scheduler import Scheduler, SchedulerOutput
from servefleet.tokens import Segment, SegmentContent

if TYPE_CHECKING:
    from servefleet.engine.cost_model import CostModel


class StepResult:
    """One step: its index and duration, what it computed, the requests that finished, and
    the engine's state after it (``engine.engine.StepResult``'s fields; a plain class: see
    ``SchedulerOutput``)."""

    __slots__ = (
        "duration",
        "finished",
        "kv_usage",
        "num_running",
        "num_waiting",
        "output",
        "step",
    )

    def __init__(
        self,
        step: int,
        duration: float,
        output: SchedulerOutput,
        finished: list[Request],
        kv_usage: float,
        num_running: int,
        num_waiting: int,
    ) -> None:
        self.step = step
        self.duration = duration
        self.output = output
        self.finished = finished
        self.kv_usage = kv_usage
        self.num_running = num_running
        self.num_waiting = num_waiting


class FastEngine:
    __slots__ = ("config", "contract", "cost", "counters", "scheduler")

    def __init__(
        self, config: SchedulerConfig, cost: CostModel, contract: OwnContent | None = None
    ) -> None:
        self.config = config
        self.cost = cost
        self.scheduler = Scheduler(config)
        # a caller reads a request's counters only once it has finished, and a step's
        # requests never (only counts)
        self.scheduler.enable_lazy_decodes(step_requests=False)
        self.counters = EngineCounters()
        self.contract = contract if contract is not None else OwnContent()
        """What the requests own (one for a fleet: ``fastpath.contract``)."""

    def validate(self, num_prompt_tokens: int, max_tokens: int) -> str | None:
        """Why a request can't be served (as vLLM words it), or None if it can."""
        return validate_request(self.config, num_prompt_tokens, max_tokens)

    def new_request(
        self,
        request_id: str,
        prompt: tuple[Segment, ...],
        prompt_tokens: int,
        max_tokens: int,
        in_session: bool,
        arrival_time: float,
    ) -> Request:
        """A request of this prompt, its own content marked (``fastpath.contract``; raises
        ``ContentContractError`` if it resends content another request owned)."""
        own = self.contract.own_from(request_id, prompt, in_session)
        content = SegmentContent(prompt, request_id)
        return Request(request_id, prompt_tokens, max_tokens, content, arrival_time, own)

    @property
    def prefix_stats(self) -> PrefixCacheStats:
        return self.scheduler.kv.stats

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

    def quiet_durations(self, limit: int) -> list[float]:
        """The durations of the coming quiet steps (``Scheduler.quiet_steps``; none if the
        next step is not quiet): each is the step ``step()`` would run, following another."""
        sched = self.scheduler
        k = sched.quiet_steps(limit)
        if not k:
            return []
        cruise = sched.cruise
        assert cruise is not None
        n, step = cruise.count, sched.step_index
        return self.cost.decode_step_times(n, [cruise.context_sum(step + j) + n for j in range(k)])

    def still_quiet(self, steps: int) -> int:
        """Of the next ``steps`` quiet steps, how many still are once a request was added
        (``Scheduler.still_quiet``); their durations are unchanged."""
        return self.scheduler.still_quiet(steps)

    def quiet_step(self, duration: float) -> float:
        """Run the coming step, quiet and of ``duration`` (from ``quiet_durations``, nothing
        added since): ``step()``'s work without a ``StepResult``. Returns the KV cache usage
        after it."""
        sched = self.scheduler
        assert sched.cruise is not None
        n = sched.cruise.count
        sched.quiet_step()
        c = self.counters
        c.steps += 1
        c.busy_time += duration
        c.generation_tokens += n
        return sched.kv.usage

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
