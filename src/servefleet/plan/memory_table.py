"""Per GPU memory of a replica for each tensor-parallel size: the arithmetic of
``engine.memory.plan_memory`` (weights, activation peak, non-torch memory, CUDA graphs, KV cache
at ``gpu_memory_utilization``), the KV blocks and tokens that follow, the longest context and the
concurrency that fit, and whether vLLM would start at all.

vLLM refuses to start when the KV cache cannot hold one sequence of ``max_model_len`` tokens, so
a TP is feasible only when ``kv_tokens >= max_model_len``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from servefleet.engine.memory import GiB, MemoryBreakdown, plan_memory, resolve_kv_dtype
from servefleet.hardware import CROSS_HOST, GPUSpec
from servefleet.models import ModelSpec
from servefleet.plan.flags import Flags


def tp_problem(model: ModelSpec, tp: int) -> str | None:
    """Why vLLM cannot shard ``model`` over ``tp`` GPUs (None: it can)."""
    m = model
    if m.num_attention_heads % tp:
        return f"TP={tp} does not divide the {m.num_attention_heads} attention heads"
    if m.intermediate_size % tp:
        return f"TP={tp} does not divide the MLP width {m.intermediate_size}"
    if m.num_kv_heads % tp and tp % m.num_kv_heads:
        return f"TP={tp} neither divides nor is a multiple of the {m.num_kv_heads} KV heads"
    return None


def candidate_tps(gpus_per_host: int, hosts: int = 1) -> list[int]:
    """Tensor-parallel sizes that split a host's GPUs into equal replicas, then (with several
    hosts) whole hosts: a replica of ``k × gpus_per_host`` GPUs spans k hosts and all-reduces
    over the network (``hardware.CROSS_HOST``), never a silent NVLink."""
    inside = [t for t in range(1, gpus_per_host + 1) if gpus_per_host % t == 0]
    return inside + [gpus_per_host * k for k in range(2, hosts + 1) if hosts % k == 0]


def spanning_gpu(gpu: GPUSpec) -> GPUSpec:
    """The GPU as a tensor-parallel group that spans hosts sees it: its link is the network."""
    return replace(gpu, interconnect=CROSS_HOST)


@dataclass(frozen=True, slots=True)
class MemoryRow:
    tp: int
    replicas: int
    problem: str | None
    """Why this TP cannot run (sharding or memory), None when it can."""
    memory: MemoryBreakdown | None
    flags: Flags | None
    max_model_len: int
    mean_request_tokens: float

    @property
    def feasible(self) -> bool:
        return self.problem is None

    @property
    def longest_context(self) -> int:
        """The longest single sequence the KV cache holds (all of it for one request)."""
        return self.memory.kv_tokens if self.memory else 0

    @property
    def concurrency(self) -> float:
        """Requests of the workload's mean prompt + output that fit in the KV cache at once."""
        return self.memory.max_concurrency(self.mean_request_tokens) if self.memory else 0.0

    def to_dict(self) -> dict:
        m = self.memory
        return {
            "tp": self.tp,
            "replicas": self.replicas,
            "feasible": self.feasible,
            "problem": self.problem,
            "per_gpu_bytes": None
            if m is None
            else {
                "total": m.total,
                "budget": m.budget,
                "weights": m.weights,
                "activation_peak": m.activation_peak,
                "non_torch": m.non_torch,
                "cuda_graphs": m.cuda_graphs,
                "kv_cache": m.kv_cache,
            },
            "kv_bytes_per_token": m.kv_bytes_per_token if m else None,
            "num_gpu_blocks": m.num_gpu_blocks if m else 0,
            "kv_tokens": self.longest_context,
            "longest_context": self.longest_context,
            "concurrency_at_mean_length": self.concurrency,
            "flags": None if self.flags is None else self.flags.values(),
        }


def kv_arithmetic(mem: MemoryBreakdown) -> str:
    """``budget - weights - activations - non-torch [- CUDA graphs] = KV cache`` in GiB, with
    the CUDA graphs subtracted only when ``plan_memory`` subtracts them."""
    text = (
        f"{mem.budget / GiB:.2f} GiB usable - weights {mem.weights / GiB:.2f} "
        f"- activations {mem.activation_peak / GiB:.2f} - non-torch {mem.non_torch / GiB:.2f} "
    )
    if graphs_in_budget(mem):
        text += f"- CUDA graphs {mem.cuda_graphs / GiB:.2f} "
    return text + f"= {mem.kv_cache / GiB:.2f} GiB"


def graphs_in_budget(mem: MemoryBreakdown) -> bool:
    """Whether ``plan_memory`` takes the CUDA graphs out of the KV budget."""
    return (
        mem.cuda_graphs > 0
        and mem.budget - mem.weights - mem.activation_peak - mem.non_torch - mem.cuda_graphs
        == mem.kv_cache
    )


def memory_row(
    model: ModelSpec,
    gpu: GPUSpec,
    dtype: str,
    tp: int,
    replicas: int,
    flags: Flags | None,
    max_model_len: int,
    mean_request_tokens: float,
) -> MemoryRow:
    problem = tp_problem(model, tp)
    if problem is not None or flags is None:
        return MemoryRow(tp, replicas, problem, None, flags, max_model_len, mean_request_tokens)
    mem = plan_memory(
        model,
        gpu,
        tp,
        dtype,
        flags.gpu_memory_utilization,
        flags.max_num_batched_tokens,
        flags.max_num_seqs,
        flags.block_size,
        resolve_kv_dtype(flags.kv_cache_dtype, dtype, gpu),
        flags.enforce_eager,
    )
    if not mem.fits:
        problem = f"does not fit: {kv_arithmetic(mem)} leaves no KV cache"
    elif mem.kv_tokens < max_model_len:
        problem = (
            f"KV cache of {mem.kv_cache / GiB:.2f} GiB holds {mem.kv_tokens:,} tokens, fewer than "
            f"one sequence of max-model-len {max_model_len:,} (vLLM refuses to start)"
        )
    return MemoryRow(tp, replicas, problem, mem, flags, max_model_len, mean_request_tokens)
