"""How long one engine step takes on a GPU: a roofline per part of the batch.

A step's time is the sum over its parts of max(FLOPs / achievable FLOP/s, bytes / achievable
bandwidth), each kernel with a fixed launch/latency term, plus two tensor-parallel all-reduces
per layer and a per-step overhead:

* linear layers (qkv, o, gate_up, down; per GPU shard): one GEMM each for all tokens of the step,
  ``kernel_floor_s + max(compute, memory)``; compute efficiency rises with the token count M as
  ``gemm_max · M / (M + gemm_half_tokens)``, memory time streams the weights;
* LM head only for positions that sample a token;
* attention: one kernel per layer for the whole batch (vLLM's varlen FlashAttention), a fixed
  ``attn_*_floor_s`` plus the prefill chunks' causal FLOPs at ``attn_prefill`` and the decodes'
  KV bytes at ``attn_decode_bw``;

The "floor + roofline" form is the one the H200 measurements fit best (median error 5 % for
GEMMs, 7-11 % for attention, against 7 % and 19-25 % for ``max(floor, roofline)``:
docs/calibration-data.md).
* elementwise work (norms, activation, residuals, rotary): memory-bound on activations;
* tensor parallelism (``multi_gpu``, from ``servefleet.hardware_tp``): the all-reduces by the
  algorithm vLLM picks for their size and their per-layer barrier waits (GPU), the logits'
  all-gather (GPU, with the LM head), the executor's broadcast and gather (host); nothing at TP=1;
* GPU overhead per step (the small kernels left out above);
* host work per step and per sequence (scheduling, preparing inputs, launching, processing
  outputs): smaller for decode-only steps replayed from CUDA graphs.

The GPU parts add up; the host work runs on the CPU. With async scheduling (vLLM 0.26's
default engine loop) the CPU prepares step k+1 while the GPU runs step k, so a step that follows
another takes ``max(gpu, host)``; the first step after the engine was idle, or every step
without async scheduling (``overlap_host=False``), takes ``gpu + host``.

Achievable rates come from ``GPUSpec.efficiency`` (measured, or labelled as assumed there), never
from the datasheet alone. Every other constant is in the block below with its source.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from servefleet.compiled import frozen_reduce
from servefleet.hardware import GPUSpec
from servefleet.hardware_tp import DEFAULT_COSTS, NO_TP, TPCosts, TPStep, tp_step
from servefleet.models import ModelSpec

# --- constants (each with its source) -----------------------------------------------------
ELEMENTWISE_HIDDEN_PASSES = 10
"""Reads+writes of a hidden-sized vector per token per layer: 2 RMSNorms (read, write each),
2 residual adds (2 reads, 1 write each). Counted from the Llama/Qwen2 layer structure."""
ELEMENTWISE_INTER_PASSES = 3
"""SiLU-and-mul: reads gate and up, writes one intermediate-sized vector (same source)."""
SAMPLER_BYTES_PER_LOGIT = 12
"""fp32 logits written, read by softmax/top-k, probabilities written (same source, vLLM sampler)."""

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}
FA3_FP8_RELATIVE_EFFICIENCY = 0.81
"""FlashAttention-3 in fp8 reaches a smaller fraction of the fp8 peak than in bf16 of the bf16
peak: about 1,200 of 1,979 TFLOP/s against 740 of 989 on an H100 (Shah et al., "FlashAttention-3",
2024, sections 1 and 4.1): 0.606 / 0.748 = 0.81. Applied to the measured bf16 fraction when
vLLM runs attention in fp8 (an fp8 KV cache on a GPU whose FlashAttention-3 has fp8 kernels)."""


def _fa3(gpu: GPUSpec) -> bool:
    """vLLM runs FlashAttention-3 (which has fp8 kernels) on sm90 with the FLASH_ATTN backend."""
    return gpu.attention_backend == "FLASH_ATTN" and tuple(gpu.compute_capability) >= (9, 0)


@dataclass(frozen=True, slots=True)
class StepBreakdown:
    linear: float
    lm_head: float
    attention_prefill: float
    attention_decode: float
    attention_launch: float
    elementwise: float
    allreduce: float
    """The all-reduces and their barrier waits (``CostModel.multi_gpu``)."""
    overhead: float
    """The GPU's fixed time per step (CUDA-graph replay or piecewise/eager launch)."""
    host: float = 0.0
    """The CPU's work for the step (per step + per sequence)."""
    overlap_host: bool = True
    """Async scheduling: host work of the next step runs while the GPU computes this one."""

    @property
    def gpu(self) -> float:
        return (
            self.linear
            + self.lm_head
            + self.attention_prefill
            + self.attention_decode
            + self.attention_launch
            + self.elementwise
            + self.allreduce
            + self.overhead
        )

    @property
    def total(self) -> float:
        return max(self.gpu, self.host) if self.overlap_host else self.gpu + self.host

    def __reduce__(self) -> tuple[type, tuple[Any, ...]]:
        return frozen_reduce(self)  # compiled: pickle and copy (servefleet.compiled)


class CostModel:
    """Step time of one replica: ``model`` on ``tp`` GPUs of type ``gpu`` in ``dtype``."""

    def __init__(
        self,
        model: ModelSpec,
        gpu: GPUSpec,
        tp: int = 1,
        dtype: str = "fp16",
        kv_dtype: str | None = None,
        cuda_graph_max_batch: int = 512,
        enforce_eager: bool = False,
        overlap_host: bool = True,
        tp_costs: TPCosts = DEFAULT_COSTS,
    ) -> None:
        if tp < 1 or model.num_attention_heads % tp:
            raise ValueError(
                f"tensor parallel size {tp} must divide the {model.num_attention_heads} attention heads"
            )
        self.model, self.gpu, self.tp = model, gpu, tp
        self.tp_costs = tp_costs
        """The multi-GPU step's constants (``servefleet.hardware_tp``)."""
        self.dtype = dtype
        act = dtype if dtype in ("bf16", "fp16") else ("bf16" if gpu.bf16 else "fp16")
        self.kv_dtype = kv_dtype or act
        self.wbytes = DTYPE_BYTES[dtype]
        self.abytes = 2  # activations stay 16-bit
        self.kvbytes = DTYPE_BYTES[self.kv_dtype]
        self.cuda_graph_max_batch = 0 if enforce_eager else cuda_graph_max_batch
        self.overlap_host = overlap_host
        eff = gpu.efficiency
        self.eff = eff
        compute_dtype = dtype if dtype in gpu.flops else "fp16"
        self.peak = gpu.peak_flops(compute_dtype)
        """Linear layers: the weights' dtype (fp8 GEMMs on fp8 tensor cores)."""
        self.head_peak = gpu.peak_flops(act)
        """The LM head stays 16-bit in fp8/int8 checkpoints (and in vLLM's online fp8)."""
        self.attn_peak = self.head_peak
        """Attention runs in the activations' dtype: vLLM keeps a bf16 KV cache for fp8
        weights unless ``--kv-cache-dtype fp8``, and only FlashAttention-3 (sm90) then
        computes in fp8; elsewhere an fp8 cache halves the bytes read, not the FLOP rate."""
        if self.kv_dtype == "fp8" and "fp8" in gpu.flops and _fa3(gpu):
            self.attn_peak = gpu.peak_flops("fp8") * FA3_FP8_RELATIVE_EFFICIENCY
        self.bw = gpu.hbm_bandwidth
        self.attn_kv_rate = self.bw * eff.attn_decode_bw
        """Bytes/s the attention kernels read the KV cache at (``bw × attn_decode_bw``)."""
        self.attn_rate = self.attn_peak * eff.attn_prefill
        """FLOP/s of the attention kernels (``attn_peak × attn_prefill``)."""
        m, h = model, model.hidden_size
        self.gemms = (
            ((m.q_size + 2 * m.kv_size) // tp, h),  # qkv_proj (column parallel)
            (h, m.q_size // tp),  # o_proj (row parallel)
            (2 * m.intermediate_size // tp, h),  # gate_up_proj (column parallel)
            (h, m.intermediate_size // tp),  # down_proj (row parallel)
        )
        self.layers = m.num_layers
        self.lm_head = (m.vocab_size // tp, h)
        self.heads_per_gpu = m.num_attention_heads // tp
        self.kv_heads_per_gpu = max(1, m.num_kv_heads // tp)
        self.kv_bytes_per_token = (
            2 * m.num_layers * self.kv_heads_per_gpu * m.head_dim * self.kvbytes
        )
        self.attn_flops_per_pair = 4 * m.num_layers * self.heads_per_gpu * m.head_dim
        self.elementwise_bytes_per_token = (
            m.num_layers
            * self.abytes
            * (ELEMENTWISE_HIDDEN_PASSES * h + ELEMENTWISE_INTER_PASSES * m.intermediate_size // tp)
        )
        self._linear_cache: dict[int, float] = {}
        self._token_terms: dict[int, tuple[float, float, float]] = {}
        """num_tokens -> (linear, elementwise, all-reduce) times."""
        self._lm_head_cache: dict[int, float] = {}
        self._overhead_cache: dict[tuple[int, bool], tuple[float, float]] = {}
        """(num_seqs, decode_only) -> (GPU fixed time, host time)."""

    # -- parts -----------------------------------------------------------------------------
    def gemm_time(
        self, m: int, n: int, k: int, peak: float | None = None, wbytes: int | None = None
    ) -> float:
        """One GEMM of ``m`` tokens by an ``n x k`` weight (in the linear layers' dtype unless
        ``peak``/``wbytes`` say otherwise)."""
        eff = self.eff
        flops_rate = (peak or self.peak) * eff.gemm_max * m / (m + eff.gemm_half_tokens)
        t_compute = 2.0 * m * n * k / flops_rate
        weights = n * k * (wbytes or self.wbytes)
        t_memory = (weights + m * (n + k) * self.abytes) / (self.bw * eff.weight_bw)
        return eff.kernel_floor_s + max(t_compute, t_memory)

    def linear_time(self, num_tokens: int) -> float:
        """All linear layers of all layers for ``num_tokens`` tokens (memoised; the key is
        bounded by the token budget)."""
        t = self._linear_cache.get(num_tokens)
        if t is None:
            # a list summed from 0.0: the same float compiled or not (docs/simulate.md,
            # "A compiled core")
            gemms = [self.gemm_time(num_tokens, n, k) for n, k in self.gemms]
            t = self.layers * sum(gemms, 0.0)
            self._linear_cache[num_tokens] = t
        return t

    def lm_head_time(self, num_sampled: int) -> float:
        """The LM head (split by vocabulary under TP) for the sampled positions, the gather of
        their logits to every rank, and the sampler over the whole vocabulary (each rank samples
        from all of it)."""
        if num_sampled == 0:
            return 0.0
        n, k = self.lm_head
        sampler = (
            num_sampled
            * self.model.vocab_size
            * SAMPLER_BYTES_PER_LOGIT
            / (self.bw * self.eff.weight_bw)
        )
        t = self.gemm_time(num_sampled, n, k, self.head_peak, self.abytes) + sampler
        if self.tp > 1:
            t += self.multi_gpu(num_sampled, 0, num_sampled).logits_gather
        return t

    def prefill_attention_time(self, chunks: list[tuple[int, int]]) -> float:
        """The prefill chunks' share of the attention kernels (no launch floor)."""
        if not chunks:
            return 0.0
        pairs = 0.0
        kv_tokens = 0
        for c, o in chunks:
            pairs += c * o + c * (c + 1) / 2
            kv_tokens += o + c
        t_compute = self.attn_flops_per_pair * pairs / self.attn_rate
        t_memory = kv_tokens * self.kv_bytes_per_token / self.attn_kv_rate
        return max(t_compute, t_memory)

    def decode_attention_time(self, num_decodes: int, decode_context: int) -> float:
        """The decodes' share of the attention kernels: their KV read (no launch floor)."""
        if num_decodes == 0:
            return 0.0
        t_memory = decode_context * self.kv_bytes_per_token / self.attn_kv_rate
        t_compute = self.attn_flops_per_pair * decode_context / self.attn_rate
        return max(t_memory, t_compute)

    def attention_floor_time(self, has_prefill: bool) -> float:
        """One attention kernel per layer per step."""
        eff = self.eff
        return self.layers * (eff.attn_prefill_floor_s if has_prefill else eff.attn_decode_floor_s)

    def elementwise_time(self, num_tokens: int) -> float:
        return num_tokens * self.elementwise_bytes_per_token / (self.bw * self.eff.weight_bw)

    def multi_gpu(self, num_tokens: int, num_seqs: int = 0, num_sampled: int = 0) -> TPStep:
        """What tensor parallelism adds to a step (``servefleet.hardware_tp.tp_step``): the one
        place the cost model reads it; all parts 0 at TP=1."""
        if self.tp == 1:
            return NO_TP
        m = self.model
        return tp_step(
            self.tp,
            self.layers,
            num_tokens,
            m.hidden_size,
            num_seqs,
            self.gpu.interconnect,
            self.tp_costs,
            act_bytes=self.abytes,
            num_sampled=num_sampled,
            vocab_size=m.vocab_size,
        )

    def allreduce_time(self, num_tokens: int) -> float:
        """Two all-reduces per layer of the step's hidden states, and their barrier waits."""
        if self.tp == 1:
            return 0.0
        tp = self.multi_gpu(num_tokens)
        return tp.allreduce + tp.sync

    def overhead_time(self, num_seqs: int, decode_only: bool) -> float:
        """The GPU's fixed time per step: the small kernels the parts above leave out (norms,
        rotary, KV writes, sampler) of a decode-only step replayed from a CUDA graph, or the
        launch gaps of a step run piece by piece (prefill chunks, more sequences than the
        largest graph, ``--enforce-eager``)."""
        eff = self.eff
        graph = decode_only and num_seqs <= self.cuda_graph_max_batch
        return eff.graph_step_overhead_s if graph else eff.step_overhead_s

    def host_time(self, num_seqs: int, decode_only: bool) -> float:
        """The CPU's work for a step of ``num_seqs`` sequences (scheduling, inputs, outputs;
        under TP, the executor's broadcast to the workers and gather of their results)."""
        host = self.eff.host_step_s + self.eff.per_seq_overhead_s * num_seqs
        if self.tp > 1:
            host += self.multi_gpu(1, num_seqs).executor
        return host

    # -- the step --------------------------------------------------------------------------
    def breakdown(
        self,
        num_tokens: int,
        num_seqs: int,
        num_decodes: int,
        decode_context: int,
        prefill_chunks: list[tuple[int, int]],
        num_sampled: int,
    ) -> StepBreakdown:
        return StepBreakdown(
            linear=self.linear_time(num_tokens),
            lm_head=self.lm_head_time(num_sampled),
            attention_prefill=self.prefill_attention_time(prefill_chunks),
            attention_decode=self.decode_attention_time(num_decodes, decode_context),
            attention_launch=self.attention_floor_time(bool(prefill_chunks)),
            elementwise=self.elementwise_time(num_tokens),
            allreduce=self.allreduce_time(num_tokens),
            overhead=self.overhead_time(num_seqs, not prefill_chunks),
            host=self.host_time(num_seqs, not prefill_chunks),
            overlap_host=self.overlap_host,
        )

    def step_time(
        self,
        num_tokens: int,
        num_seqs: int,
        num_decodes: int,
        decode_context: int,
        prefill_chunks: list[tuple[int, int]],
        num_sampled: int,
        from_idle: bool = False,
    ) -> float:
        """Seconds for one step of this batch (``breakdown(...).total``: the GPU's parts added
        in that order, against the host's work; the parts that depend on one count are
        memoised). ``from_idle``: the engine had no step in flight, so the host's work for this
        one comes before the GPU's (it overlaps only with a step already running)."""
        if num_tokens == 0:
            return 0.0
        terms = self._token_parts(num_tokens)
        lm_head = self._lm_head(num_sampled)
        decode_only = not prefill_chunks
        fixed = self._fixed_parts(num_seqs, decode_only)
        gpu = (
            terms[0]
            + lm_head
            + self.prefill_attention_time(prefill_chunks)
            + self.decode_attention_time(num_decodes, decode_context)
            + self.attention_floor_time(not decode_only)
            + terms[1]
            + terms[2]
            + fixed[0]
        )
        if self.overlap_host and not from_idle:
            return gpu if gpu >= fixed[1] else fixed[1]
        return gpu + fixed[1]

    def _token_parts(self, num_tokens: int) -> tuple[float, float, float]:
        """The GEMMs', the elementwise kernels' and the all-reduces' times (memoised)."""
        terms = self._token_terms.get(num_tokens)
        if terms is None:
            terms = self._token_terms[num_tokens] = (
                self.linear_time(num_tokens),
                self.elementwise_time(num_tokens),
                self.allreduce_time(num_tokens),
            )
        return terms

    def _lm_head(self, num_sampled: int) -> float:
        lm_head = self._lm_head_cache.get(num_sampled)
        if lm_head is None:
            lm_head = self._lm_head_cache[num_sampled] = self.lm_head_time(num_sampled)
        return lm_head

    def _fixed_parts(self, num_seqs: int, decode_only: bool) -> tuple[float, float]:
        """The GPU's fixed time and the host's time of a step (memoised)."""
        fixed = self._overhead_cache.get((num_seqs, decode_only))
        if fixed is None:
            fixed = (
                self.overhead_time(num_seqs, decode_only),
                self.host_time(num_seqs, decode_only),
            )
            self._overhead_cache[num_seqs, decode_only] = fixed
        return fixed

    def decode_step_times(self, num_seqs: int, contexts: list[int]) -> list[float]:
        """``step_time`` of a step of ``num_seqs`` decodes that follows another (each request
        computes and samples one token), for each total ``decode_context`` in ``contexts``:
        the same sums (bit for bit), with the parts that do not depend on the context worked
        out once (a quiet run of steps, ``FastEngine.quiet_durations``)."""
        if num_seqs == 0:
            return [0.0] * len(contexts)
        terms = self._token_parts(num_seqs)
        lm_head = self._lm_head(num_seqs)
        fixed = self._fixed_parts(num_seqs, True)
        floor = self.attention_floor_time(False)
        host = fixed[1]
        overlap = self.overlap_host
        times: list[float] = []
        for context in contexts:
            gpu = (
                terms[0]
                + lm_head
                + self.decode_attention_time(num_seqs, context)
                + floor
                + terms[1]
                + terms[2]
                + fixed[0]
            )  # step_time's sum, less its "+ 0.0" for no prefill chunks
            if overlap:
                times.append(gpu if gpu >= host else host)
            else:
                times.append(gpu + host)
        return times

    def bandwidth_bound(
        self, num_tokens: int, decode_context: int, kv_tokens_prefill: int = 0
    ) -> float:
        """The time no step can beat: weights (÷ TP) plus KV read once at datasheet bandwidth."""
        if num_tokens == 0:
            return 0.0
        weights = self.layers * sum(n * k for n, k in self.gemms) * self.wbytes
        kv = (decode_context + kv_tokens_prefill) * self.kv_bytes_per_token
        return (weights + kv) / self.bw

    # -- single-request predictions (used by tests, the sim-server and the planner) ---------
    def prefill_time(self, prompt_tokens: int, budget: int, cached_tokens: int = 0) -> float:
        """Time to prefill one prompt alone on an idle engine, chunked by ``budget`` tokens
        per step (the first step starts from idle)."""
        t, done = 0.0, cached_tokens
        while done < prompt_tokens:
            c = min(budget, prompt_tokens - done)
            last = done + c == prompt_tokens
            t += self.step_time(c, 1, 0, 0, [(c, done)], 1 if last else 0, done == cached_tokens)
            done += c
        return t

    def decode_step_time(self, batch: int, mean_context: int) -> float:
        return self.step_time(batch, batch, batch, batch * mean_context, [], batch)
