"""What the fleet simulator asks of a replica's engine, and the one place that picks one.

``ClusterSim`` drives every replica through ``ReplicaEngine``. Two engines keep it:

* the plain rule, ``engine.Engine`` (``PlainReplica``): vLLM V1's scheduler, KV cache manager
  and block pool as written, one step after another;
* the fast path, ``fastpath.FastEngine``: the same steps, durations, blocks and counters with
  far less work per step (lazy decodes, blocks cached late, quiet steps run in one event;
  ``fastpath``), compiled where a C compiler is found.

``replica_engine`` picks one (``ClusterSim(fast=...)``); ``tests/test_sim_quiet.py`` and
``benchmarks/sim_equivalence.py`` check that both give the same results.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from servefleet.engine.config import SchedulerConfig
from servefleet.engine.cost_model import CostModel
from servefleet.engine.engine import Engine, EngineCounters
from servefleet.engine.kv_cache_manager import PrefixCacheStats
from servefleet.engine.request import Request, RequestStatus
from servefleet.fastpath.contract import OwnContent
from servefleet.fastpath.engine import FastEngine
from servefleet.tokens import Segment, SegmentContent


class ReplicaRequest(Protocol):
    """A request as the simulator reads it once it has finished (``engine.request.Request``)."""

    request_id: str
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int | None
    num_preemptions: int
    num_recomputed_tokens: int
    first_scheduled_step: int | None
    arrival_time: float
    status: RequestStatus
    token_runs: list[list[int]]


class ReplicaStepOutput(Protocol):
    @property
    def num_sampled(self) -> int: ...

    @property
    def first_tokens(self) -> Sequence[ReplicaRequest]: ...


class ReplicaStep(Protocol):
    """One step (``engine.engine.StepResult``)."""

    @property
    def step(self) -> int: ...

    @property
    def duration(self) -> float: ...

    @property
    def kv_usage(self) -> float: ...

    @property
    def output(self) -> ReplicaStepOutput: ...

    @property
    def finished(self) -> list:
        """The requests that finished in the step (``ReplicaRequest``)."""
        ...


class ReplicaEngine(Protocol):
    """One replica's engine, with no clock of its own (``engine.engine.Engine``), plus:

    * ``new_request``: a request of a prompt of segments, for this engine;
    * ``quiet_durations(limit)``: the durations of the coming *quiet* steps (nothing but steady
      decodes, none finishing; none if the next step is not quiet, always none for the plain
      rule), which ``quiet_step(duration)`` then runs one by one with no output to read, and
      ``still_quiet(steps)`` says how many still are once a request was added."""

    config: SchedulerConfig
    cost: CostModel
    counters: EngineCounters

    @property
    def prefix_stats(self) -> PrefixCacheStats: ...

    @property
    def step_index(self) -> int: ...

    @property
    def num_running(self) -> int: ...

    @property
    def kv_usage(self) -> float: ...

    def validate(self, num_prompt_tokens: int, max_tokens: int) -> str | None: ...

    def new_request(
        self,
        request_id: str,
        prompt: tuple[Segment, ...],
        prompt_tokens: int,
        max_tokens: int,
        in_session: bool,
        arrival_time: float,
    ) -> ReplicaRequest: ...

    def add_request(self, req) -> None: ...

    def step(self, from_idle: bool = False) -> ReplicaStep | None: ...

    def quiet_durations(self, limit: int) -> list[float]: ...

    def still_quiet(self, steps: int) -> int: ...

    def quiet_step(self, duration: float) -> float: ...


class PlainReplica(Engine):
    """The plain rule as a ``ReplicaEngine``: it has no quiet steps."""

    def new_request(
        self,
        request_id: str,
        prompt: tuple[Segment, ...],
        prompt_tokens: int,
        max_tokens: int,
        in_session: bool,
        arrival_time: float,
    ) -> Request:
        content = SegmentContent(prompt, request_id)
        return Request(request_id, prompt_tokens, max_tokens, content, arrival_time)

    @property
    def prefix_stats(self) -> PrefixCacheStats:
        return self.scheduler.kv.stats

    def quiet_durations(self, limit: int) -> list[float]:
        return []

    def still_quiet(self, steps: int) -> int:
        return 0

    def quiet_step(self, duration: float) -> float:
        raise RuntimeError("the plain rule has no quiet steps")


def replica_engine(
    config: SchedulerConfig, cost: CostModel, fast: bool, contract: OwnContent
) -> ReplicaEngine:
    """A replica's engine: the fast path, or the plain rule (``fast=False``). ``contract``:
    what the fleet's requests own (one for all replicas: ``fastpath.contract``)."""
    if fast:
        return FastEngine(config, cost, contract)
    return PlainReplica(config, cost)
