"""The engine model: vLLM V1 scheduling, paged KV cache with prefix caching, and step costs.

This is the rule as a reader expects it (``scheduler.Scheduler.schedule``, ``kv_cache_manager``,
``block_pool``); the sim-server runs it. The fleet simulator runs the same rule through
``servefleet.fastpath``, checked against this one."""

from servefleet.engine.config import SchedulerConfig, vllm_default_batch
from servefleet.engine.engine import Engine, StepResult
from servefleet.engine.request import Request, RequestStatus, SegmentContent, TokenIdContent
from servefleet.engine.scheduler import Scheduler, SchedulerOutput

__all__ = [
    "Engine",
    "Request",
    "RequestStatus",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerOutput",
    "SegmentContent",
    "StepResult",
    "TokenIdContent",
    "vllm_default_batch",
]
