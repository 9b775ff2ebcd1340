"""Engine (scheduler + KV cache) settings, with vLLM's names and defaults."""

from __future__ import annotations

from dataclasses import dataclass

GiB = 1 << 30

# vLLM's defaults for `vllm serve` (vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults):
# GPUs with >= 70 GiB that are not A100s get the large budget; all others the small one.
LARGE_GPU_BYTES = 70 * GiB
DEFAULT_BATCH_LARGE = (8192, 1024)  # (max_num_batched_tokens, max_num_seqs)
DEFAULT_BATCH_SMALL = (2048, 256)
DEFAULT_BLOCK_SIZE = 16
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92
"""vLLM 0.26's default, as its start-up log on the H200 shows ("Desired GPU memory utilization is
(0.92, ...)"); earlier versions used 0.9."""
CUDA_GRAPH_MAX_BATCH = 512
"""Largest decode batch vLLM V1 captures in a CUDA graph by default (max_cudagraph_capture_size)."""


def vllm_default_batch(gpu_name: str, gpu_memory_bytes: int) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) that `vllm serve` picks on this GPU."""
    if gpu_memory_bytes >= LARGE_GPU_BYTES and "a100" not in gpu_name.lower():
        return DEFAULT_BATCH_LARGE
    return DEFAULT_BATCH_SMALL


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    num_gpu_blocks: int
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int = 4096
    block_size: int = DEFAULT_BLOCK_SIZE
    enable_prefix_caching: bool = True
    cuda_graph_max_batch: int = CUDA_GRAPH_MAX_BATCH
    enforce_eager: bool = False
    async_scheduling: bool = True
    """vLLM >= 0.12 schedules step k+1 as soon as step k is launched (its default engine core
    loop, ``step_with_batch_queue``), so a request that arrives while a step runs joins the step
    after next (``Scheduler.add_request``)."""

    def __post_init__(self) -> None:
        for name in (
            "num_gpu_blocks",
            "max_num_seqs",
            "max_num_batched_tokens",
            "max_model_len",
            "block_size",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size
