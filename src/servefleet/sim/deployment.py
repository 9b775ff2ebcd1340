"""One replica group's settings (model, GPU, TP, vLLM flags) resolved the way `vllm serve`
would resolve them, and the engines built from them."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from servefleet.client_protocol import SDK_CHAT, ClientProtocol
from servefleet.engine.config import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_GPU_MEMORY_UTILIZATION,
    SchedulerConfig,
    vllm_default_batch,
)
from servefleet.engine.cost_model import CostModel
from servefleet.engine.engine import Engine
from servefleet.engine.memory import (
    MemoryBreakdown,
    plan_memory,
    resolve_dtype,
    resolve_kv_dtype,
)
from servefleet.engine.versions import DEFAULT_VERSION, VllmProfile, vllm_profile
from servefleet.hardware import GPUSpec
from servefleet.models import ModelSpec
from servefleet.sim.resend import EXACT, AnswerResend


@dataclass(frozen=True, slots=True)
class Deployment:
    """``replicas`` copies of ``model`` on ``tp`` GPUs each."""

    model: ModelSpec
    gpu: GPUSpec
    tp: int
    replicas: int
    dtype: str
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    block_size: int = DEFAULT_BLOCK_SIZE
    enable_prefix_caching: bool = True
    enforce_eager: bool = False
    kv_dtype: str = "fp16"
    """What the KV cache stores (``resolve_kv_dtype`` of ``--kv-cache-dtype``)."""
    notes: tuple[str, ...] = field(default=())
    replicas_per_gpu: int = 1
    """Replicas sharing each group of ``tp`` GPUs (small models on big GPUs): each takes
    ``gpu_memory_utilization`` of the memory, and their steps take turns on the GPU."""
    answers: AnswerResend = EXACT
    """How the served model's tokenizer sees the answers a session resends as text."""
    vllm_version: str = DEFAULT_VERSION
    """The vLLM release the prediction is for (``engine.versions``)."""
    client: ClientProtocol = SDK_CHAT
    """How the clients stream (``sim.client_protocol``): the API server's work per token."""

    @property
    def vllm(self) -> VllmProfile:
        return vllm_profile(self.vllm_version)

    @property
    def num_gpus(self) -> int:
        return self.tp * self.replicas // self.replicas_per_gpu

    def memory(self) -> MemoryBreakdown:
        return plan_memory(
            self.model,
            self.gpu,
            self.tp,
            self.dtype,
            self.gpu_memory_utilization,
            self.max_num_batched_tokens,
            self.max_num_seqs,
            self.block_size,
            self.kv_dtype,
            self.enforce_eager,
        )

    def cost_model(self) -> CostModel:
        return CostModel(
            self.model,
            self.gpu,
            self.tp,
            self.dtype,
            self.kv_dtype,
            enforce_eager=self.enforce_eager,
            overlap_host=self.vllm.async_scheduling,
        )

    def scheduler_config(self) -> SchedulerConfig:
        mem = self.memory()
        if not mem.fits:
            raise ValueError(self.why_not_fits(mem))
        return SchedulerConfig(
            num_gpu_blocks=mem.num_gpu_blocks,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            block_size=self.block_size,
            enable_prefix_caching=self.enable_prefix_caching,
            enforce_eager=self.enforce_eager,
            async_scheduling=self.vllm.async_scheduling,
        )

    def why_not_fits(self, mem: MemoryBreakdown) -> str:
        gib = 1 << 30
        return (
            f"{self.model.name} in {self.dtype} with TP={self.tp} does not fit on {self.gpu.name}: "
            f"{mem.budget / gib:.1f} GiB usable (gpu_memory_utilization {self.gpu_memory_utilization}) "
            f"- weights {mem.weights / gib:.1f} - activations {mem.activation_peak / gib:.1f} "
            f"- other {(mem.non_torch + mem.cuda_graphs) / gib:.1f} leaves no KV cache; "
            "use more tensor parallelism, a smaller dtype, or a GPU with more memory"
        )

    def build_engine(self) -> Engine:
        return Engine(self.scheduler_config(), self.cost_model())

    def with_(self, **changes) -> Deployment:
        return replace(self, **changes)


def resolve_deployment(
    model: ModelSpec,
    gpu: GPUSpec,
    *,
    tp: int = 1,
    replicas: int | None = None,
    num_gpus: int | None = None,
    dtype: str = "auto",
    max_model_len: int | None = None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    block_size: int = DEFAULT_BLOCK_SIZE,
    enable_prefix_caching: bool = True,
    enforce_eager: bool = False,
    replicas_per_gpu: int = 1,
    kv_cache_dtype: str = "auto",
    answers: AnswerResend = EXACT,
    vllm_version: str = DEFAULT_VERSION,
    client: ClientProtocol = SDK_CHAT,
) -> Deployment:
    """Fill unset flags with vLLM's defaults for this GPU, and check that TP and counts fit."""
    if tp < 1:
        raise ValueError(f"--tp must be >= 1, got {tp}")
    if replicas_per_gpu < 1:
        raise ValueError(f"--replicas-per-gpu must be >= 1, got {replicas_per_gpu}")
    if replicas_per_gpu * gpu_memory_utilization > 1.0 + 1e-9:
        raise ValueError(
            f"{replicas_per_gpu} replicas per GPU x gpu_memory_utilization "
            f"{gpu_memory_utilization:g} is more than the GPU's memory: use at most "
            f"{1.0 / replicas_per_gpu:.2f}"
        )
    if model.num_attention_heads % tp:
        raise ValueError(
            f"--tp {tp} must divide {model.name}'s {model.num_attention_heads} attention heads"
        )
    k = replicas_per_gpu
    if replicas is None:
        if num_gpus is None:
            replicas = k
        elif num_gpus % tp:
            raise ValueError(f"{num_gpus} GPUs cannot be split into replicas of TP={tp}")
        else:
            replicas = num_gpus // tp * k
    elif num_gpus is not None and -(-replicas // k) * tp > num_gpus:
        raise ValueError(
            f"{replicas} replicas x TP={tp} ({k} per GPU) need {-(-replicas // k) * tp} GPUs, "
            f"only {num_gpus} given"
        )
    if replicas < 1:
        raise ValueError("at least one replica is needed")
    if replicas % k:
        raise ValueError(f"{replicas} replicas cannot share GPUs {k} by {k}")
    version = vllm_profile(vllm_version).version
    resolved, note = resolve_dtype(model, gpu, dtype)
    kv_dtype = resolve_kv_dtype(kv_cache_dtype, resolved, gpu)
    batch_tokens, seqs = vllm_default_batch(gpu.name, gpu.memory_bytes)
    max_len = max_model_len or model.max_position_embeddings
    mnbt = max_num_batched_tokens or batch_tokens
    return Deployment(
        model=model,
        gpu=gpu,
        tp=tp,
        replicas=replicas,
        dtype=resolved,
        max_model_len=max_len,
        max_num_seqs=max_num_seqs or seqs,
        max_num_batched_tokens=mnbt,
        gpu_memory_utilization=gpu_memory_utilization,
        block_size=block_size,
        enable_prefix_caching=enable_prefix_caching,
        enforce_eager=enforce_eager,
        kv_dtype=kv_dtype,
        notes=(note,) if note else (),
        replicas_per_gpu=k,
        answers=answers,
        vllm_version=version,
        client=client,
    )
