"""The engine model: vLLM V1 scheduling, paged KV cache with prefix caching, and step costs."""

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
