"""GPU memory arithmetic of one vLLM replica, and the KV capacity that follows.

vLLM V1 (0.26) sizes its KV cache after a profiling run:
``kv_cache = gpu_memory_utilization × total − weights − activation peak − non-torch memory``.
CUDA graphs are captured afterwards, in the memory left outside that budget; vLLM logs their
size but does not subtract it. Checked against vLLM 0.26's start-up log on an H200 (Qwen2.5-7B
shape, bf16, gpu_memory_utilization 0.92): 128.62 − 14.29 − 1.13 − 0.22 = 112.98 GiB of KV
cache, 2,115,440 tokens (benchmarks/real_vllm/README.md). The KV cache is cut into blocks of
``block_size`` tokens of every layer.
"""

from __future__ import annotations

from dataclasses import dataclass

from servefleet.hardware import GPUSpec
from servefleet.models import ModelSpec

GiB = 1 << 30

# --- constants (each with its source) -----------------------------------------------------
NON_TORCH_BYTES = int(0.22 * GiB)
"""Non-torch memory vLLM 0.26 logged on the H200 (TP=1): allocations outside torch's allocator
after start-up (the CUDA context itself is excluded by vLLM's baseline)."""
NCCL_BYTES_PER_EXTRA_GPU = int(0.25 * GiB)
"""NCCL buffers for tensor parallelism. Assumed (TP > 1 could not be measured on one GPU)."""
CUDA_GRAPH_BYTES = int(0.89 * GiB)
"""Memory of vLLM 0.26's captured CUDA graphs (51 sizes, FULL_AND_PIECEWISE) for the 7B shape on
the H200, as logged; outside the KV budget, shown for information."""
ACTIVATION_HIDDEN_BUFFERS = 4
"""Hidden-sized live buffers per token in the profiling forward (residual, normed input,
attention output, MLP output). Counted from the Llama/Qwen2 forward; with the widest tensors
below this gives 1.16 GiB for the 7B shape at 8192 tokens, vLLM logged 1.13 GiB."""
SAMPLER_LOGIT_BUFFERS = 2
"""fp32 logits and probabilities over the vocabulary for each of max_num_seqs sampled rows
(the sampler's dummy run, which peaks apart from the forward)."""


def resolve_dtype(
    model: ModelSpec, gpu: GPUSpec, requested: str = "auto"
) -> tuple[str, str | None]:
    """The weight dtype vLLM runs, and a note when it differs from what was asked or stored."""
    stored = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp16"}.get(
        model.torch_dtype, "bf16"
    )
    if requested == "auto" and model.quantization == "fp8":
        requested = "fp8"
    want = stored if requested == "auto" else requested
    if want == "fp8" and "fp8" not in gpu.flops and gpu.compute_capability >= (8, 0):
        return "fp8", (
            f"{gpu.name} has no fp8 tensor cores: vLLM runs fp8 weights weight-only (FP8 Marlin), "
            "16-bit math on 1-byte weights"
        )
    if want == "bf16" and not gpu.bf16:
        cc = ".".join(map(str, gpu.compute_capability))
        return "fp16", (
            f"{gpu.name} (compute capability {cc}) has no bf16: weights run in fp16 "
            f"(vLLM --dtype half)"
        )
    if want not in gpu.flops and want not in ("fp16", "bf16"):
        return "fp16", f"{gpu.name} has no {want} tensor cores: running fp16"
    return want, None


KV_CACHE_DTYPES = {
    "auto": "auto",
    "bfloat16": "bf16",
    "bf16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "fp16": "fp16",
    "fp8": "fp8",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",
}
"""vLLM's ``--kv-cache-dtype`` values the model knows, and what each stores (1 or 2 bytes)."""


def activation_dtype(dtype: str, gpu: GPUSpec) -> str:
    """The 16-bit dtype activations (and vLLM's ``auto`` KV cache) run in for weights ``dtype``:
    bf16/fp16 weights keep their own; fp8/int8 weights compute in bf16 where the GPU has it."""
    if dtype in ("bf16", "fp16"):
        return dtype
    return "bf16" if gpu.bf16 else "fp16"


def resolve_kv_dtype(kv_cache_dtype: str, dtype: str, gpu: GPUSpec) -> str:
    """The KV cache's dtype for ``--kv-cache-dtype`` (``auto``: the activations' dtype, as vLLM
    does, also for fp8 weights); ValueError for a value vLLM would refuse or we do not model."""
    key = kv_cache_dtype.strip().lower()
    if key not in KV_CACHE_DTYPES:
        raise ValueError(
            f"unknown --kv-cache-dtype {kv_cache_dtype!r}; use one of: {', '.join(KV_CACHE_DTYPES)}"
        )
    kv = KV_CACHE_DTYPES[key]
    if kv == "auto":
        return activation_dtype(dtype, gpu)
    if kv == "bf16" and not gpu.bf16:
        raise ValueError(f"--kv-cache-dtype {kv_cache_dtype}: {gpu.name} has no bf16")
    return kv


@dataclass(frozen=True, slots=True)
class MemoryBreakdown:
    """Per GPU of one replica, in bytes."""

    total: int
    budget: int
    weights: int
    activation_peak: int
    non_torch: int
    cuda_graphs: int
    kv_cache: int
    kv_bytes_per_token: int
    block_size: int
    num_gpu_blocks: int

    @property
    def kv_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size

    @property
    def fits(self) -> bool:
        return self.num_gpu_blocks > 0

    def max_concurrency(self, tokens_per_request: float) -> float:
        """How many requests of this many tokens (prompt + output) fit in the KV cache."""
        if tokens_per_request <= 0:
            raise ValueError("tokens_per_request must be > 0")
        return self.kv_tokens / tokens_per_request


def weight_bytes_per_gpu(model: ModelSpec, dtype: str, tp: int) -> int:
    return -(-model.weight_bytes(dtype) // tp)


def activation_peak_bytes(
    model: ModelSpec, tp: int, max_num_batched_tokens: int, max_num_seqs: int
) -> int:
    """Peak of the profiling forward: ``max_num_batched_tokens`` tokens through one layer's
    widest tensors, or the sampler's logits for ``max_num_seqs`` rows, whichever is larger."""
    m = model
    per_token = 2 * (
        ACTIVATION_HIDDEN_BUFFERS * m.hidden_size
        + (m.q_size + 2 * m.kv_size) // tp
        + 3 * m.intermediate_size // tp
    )
    logits = SAMPLER_LOGIT_BUFFERS * 4 * max_num_seqs * m.vocab_size // tp
    return max(max_num_batched_tokens * per_token, logits)


def kv_bytes_per_token_per_gpu(model: ModelSpec, tp: int, kv_dtype: str = "fp16") -> int:
    kv_heads = max(1, model.num_kv_heads // tp)
    return 2 * model.num_layers * kv_heads * model.head_dim * (1 if kv_dtype == "fp8" else 2)


def plan_memory(
    model: ModelSpec,
    gpu: GPUSpec,
    tp: int,
    dtype: str,
    gpu_memory_utilization: float,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    block_size: int = 16,
    kv_dtype: str = "fp16",
    enforce_eager: bool = False,
) -> MemoryBreakdown:
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    budget = int(gpu.memory_bytes * gpu_memory_utilization)
    weights = weight_bytes_per_gpu(model, dtype, tp)
    act = activation_peak_bytes(model, tp, max_num_batched_tokens, max_num_seqs)
    non_torch = NON_TORCH_BYTES + (tp - 1) * NCCL_BYTES_PER_EXTRA_GPU
    graphs = 0 if enforce_eager else CUDA_GRAPH_BYTES
    kv = budget - weights - act - non_torch
    per_token = kv_bytes_per_token_per_gpu(model, tp, kv_dtype)
    blocks = max(0, kv // (per_token * block_size))
    return MemoryBreakdown(
        total=gpu.memory_bytes,
        budget=budget,
        weights=weights,
        activation_peak=act,
        non_torch=non_torch,
        cuda_graphs=graphs,
        kv_cache=kv,
        kv_bytes_per_token=per_token,
        block_size=block_size,
        num_gpu_blocks=blocks,
    )
