"""The vLLM flags of one replica group, each chosen by a rule with its reason in words.

* ``--max-model-len``: the longest request the workload declares (``longest``: session growth
  included) + ``LEN_HEADROOM``, rounded up to a multiple of ``LEN_ROUND``, at least
  ``MIN_MAX_MODEL_LEN``; a smaller limit frees no KV memory (paged attention), it only refuses
  requests — so one that would refuse part of the declared workload is an error, with the fix;
* ``--max-num-batched-tokens`` (the chunked-prefill budget per step): the largest power of two,
  up to vLLM's default for the GPU, whose full-chunk step (the chunk plus a batch of decodes, by
  the cost model) stays within the ITL SLO, so that a decode that shares a step with a prefill
  chunk still meets it;
* ``--max-num-seqs``: the running requests the KV cache holds at the workload's mean length,
  rounded up to a power of two (a request holds its full length only at its end), lowered until
  a decode step of that batch meets the ITL SLO, never above vLLM's default;
* ``--block-size`` 16 (vLLM's default) and ``--gpu-memory-utilization`` by GPU family (0.90
  on Volta, where the field saw OOMs above it; vLLM's default elsewhere);
* prefix caching on (vLLM's default) unless you turn it off, with the hit rate the workload's
  shared prefixes (system prompts, session history) allow.

Values the user sets are kept as given ("set by you"). The search (``search.py``) simulates the
chosen flags against alternatives (vLLM's defaults among them) and keeps what sustains more.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from servefleet.engine.config import (
    CUDA_GRAPH_MAX_BATCH,
    DEFAULT_BLOCK_SIZE,
    DEFAULT_GPU_MEMORY_UTILIZATION,
    vllm_default_batch,
)
from servefleet.engine.cost_model import CostModel
from servefleet.engine.memory import GiB, MemoryBreakdown, plan_memory, resolve_kv_dtype
from servefleet.hardware import GPUSpec
from servefleet.models import ModelSpec
from servefleet.plan.longest import Longest
from servefleet.plan.profile import WorkloadProfile

LEN_ROUND = 1024
LEN_HEADROOM = 1.1
"""Over the workload's token counts: the chat template's tokens and the difference between the
workload's count and the model's tokenizer."""
MIN_MAX_MODEL_LEN = 4096
"""Never below what deployments in the field chose for the same chat mixes, unless set by you."""
CHUNK_CHOICES = (256, 512, 1024, 2048, 4096, 8192, 16384)
MIN_SEQS = 8


@dataclass(frozen=True, slots=True)
class Overrides:
    """Flags the user fixed (None: the planner chooses)."""

    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    block_size: int | None = None
    gpu_memory_utilization: float | None = None
    enable_prefix_caching: bool | None = None
    kv_cache_dtype: str = "auto"
    """vLLM's --kv-cache-dtype (the user's choice; the planner never picks fp8 KV itself: it
    changes the model's numerics)."""

    def __post_init__(self) -> None:
        for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {v}")
        g = self.gpu_memory_utilization
        if g is not None and not 0 < g <= 1:
            raise ValueError(f"--gpu-memory-utilization must be in (0, 1], got {g}")


@dataclass(frozen=True, slots=True)
class Flags:
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    gpu_memory_utilization: float
    enable_prefix_caching: bool
    enforce_eager: bool = False
    kv_cache_dtype: str = "auto"
    """vLLM's --kv-cache-dtype, as given (``resolve_kv_dtype`` gives what the cache stores)."""
    reasons: tuple[tuple[str, str], ...] = ()
    """(flag, reason) in the order they were decided."""

    def reason(self, flag: str) -> str:
        return dict(self.reasons).get(flag, "")

    def with_(self, why: str, **changes) -> Flags:
        """These flags with some changed (the reasons of changed flags say ``why``)."""
        out = replace(self, **changes)
        reasons = tuple((k, why if k in changes else r) for k, r in self.reasons)
        return replace(out, reasons=reasons)

    def values(self) -> dict:
        return {
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "block_size": self.block_size,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "enable_prefix_caching": self.enable_prefix_caching,
            "enforce_eager": self.enforce_eager,
            "kv_cache_dtype": self.kv_cache_dtype,
        }

    def label(self) -> str:
        return (
            f"len {self.max_model_len}, seqs {self.max_num_seqs}, "
            f"chunk {self.max_num_batched_tokens}, "
            f"prefix {'on' if self.enable_prefix_caching else 'off'}"
        )

    def to_dict(self) -> dict:
        return self.values() | {"reasons": dict(self.reasons)}


# ---- global flags (the same for every TP) -----------------------------------------------------


def choose_max_model_len(
    model: ModelSpec, profile: WorkloadProfile, longest: Longest, fixed: int | None = None
) -> tuple[int, str, str | None]:
    """(value, reason, problem): ``problem`` is set when the value would refuse part of the
    declared workload (then the plan stops with it: a flag never silently rejects traffic)."""
    need, limit = longest.tokens, model.max_position_embeddings
    basis = (
        f"the longest request the workload declares is {need:,} tokens ({longest.how})"
        if longest.declared
        else f"{longest.how}; the workload sets no bound, so that is the longest known"
    )
    if fixed is not None:
        if fixed < need:
            return (
                fixed,
                "set by you",
                (
                    f"--max-model-len {fixed:,} would refuse part of the declared workload: {basis}, "
                    f"and vLLM answers HTTP 400 to a request whose prompt + max_tokens exceed the "
                    f"limit ({1 - profile.coverage(fixed):.2%} of the sampled requests). Use "
                    f"--max-model-len {_rounded(need, limit):,} or more (a larger limit costs no KV "
                    "memory), or shorten the workload's lengths"
                ),
            )
        return fixed, f"set by you; {basis}; it covers them all", None
    value = _rounded(need, limit)
    why = (
        f"{basis}; + {LEN_HEADROOM - 1:.0%} for the chat template and tokenizer differences, "
        f"rounded up to a multiple of {LEN_ROUND:,}, and at least {MIN_MAX_MODEL_LEN:,} (what "
        f"the field chose for chat mixes): {value:,}. A smaller limit frees no KV memory — vLLM "
        f"pages the KV cache in blocks, a request holds only the blocks it fills — it only "
        f"refuses longer requests (HTTP 400); what it must do is fit one whole sequence in a "
        f"replica's KV cache (step 4)"
    )
    if value < need:
        return (
            value,
            why,
            (
                f"{basis}, more than the {limit:,} positions {model.name} allows: vLLM would refuse "
                f"those requests with HTTP 400. Shorten the workload's longest requests (prompt, "
                f"output or session turns) to at most {limit:,} tokens, or use a model with a longer "
                "context"
            ),
        )
    return value, why, None


def _rounded(need: int, limit: int) -> int:
    value = max(MIN_MAX_MODEL_LEN, math.ceil(need * LEN_HEADROOM / LEN_ROUND) * LEN_ROUND)
    return min(value, limit)


def choose_prefix_caching(
    profile: WorkloadProfile, block_size: int, fixed: bool | None = None
) -> tuple[bool, str]:
    share = profile.shared_fraction(block_size)
    what = (
        f"{share:.1%} of prompt tokens repeat, in full {block_size}-token blocks, a prefix that an "
        "earlier request already computed"
    )
    if fixed is not None:
        return fixed, f"set by you; {what}"
    if share > 0:
        return True, (
            f"on: {what} (system prompts, session history): the expected hit rate with a cache "
            "that keeps them and sessions routed back to their replica; each hit skips that "
            "prefill. The simulated hit rate of the chosen fleet is in step 8"
        )
    return True, (
        f"on (vLLM's default): {what} as declared, so no hit is expected here — but real chat "
        "traffic carries system prompts and session history (the field saw 30-40 % of prompt "
        "tokens hit), and hashing full blocks costs little. Turn it off with "
        "--no-enable-prefix-caching only for traffic that never repeats a prefix"
    )


def block_size_reason(fixed: int | None) -> tuple[int, str]:
    if fixed is not None:
        return fixed, "set by you"
    return DEFAULT_BLOCK_SIZE, (
        f"{DEFAULT_BLOCK_SIZE}, vLLM's default: the KV cache is paged in blocks of this many "
        "tokens; prefix caching reuses only full blocks, so smaller blocks share more of a prefix"
    )


VOLTA_GPU_MEMORY_UTILIZATION = 0.90
"""On Volta (V100) the field saw out-of-memory errors above 0.90, and the vLLM images that run
on Volta default to 0.9 (a field report)."""


def utilization_reason(
    gpu: GPUSpec, kv_bytes_per_token: int, fixed: float | None
) -> tuple[float, str]:
    if fixed is not None:
        return fixed, "set by you"
    if gpu.compute_capability < (7, 5):
        u = VOLTA_GPU_MEMORY_UTILIZATION
        why = (
            f"{u:g} on Volta ({gpu.name}, compute capability "
            f"{'.'.join(map(str, gpu.compute_capability))}): the field saw out-of-memory errors "
            "above 0.90 on V100s, and the vLLM images that run on Volta default to 0.9; the "
            f"other {1 - u:.0%} ({(1 - u) * gpu.memory_bytes / GiB:.1f} GiB) holds the CUDA "
            "graphs and absorbs allocator fragmentation"
        )
        return u, why
    u = DEFAULT_GPU_MEMORY_UTILIZATION
    why = (
        f"{u:g}, vLLM's default: the other {1 - u:.0%} ({(1 - u) * gpu.memory_bytes / GiB:.1f} "
        "GiB) holds the CUDA graphs and absorbs allocator fragmentation and anything else on "
        "the GPU"
    )
    if u < 0.95:
        gain = int((0.95 - u) * gpu.memory_bytes) // kv_bytes_per_token
        why += f"; 0.95 on GPUs dedicated to vLLM would add {gain:,} KV tokens per GPU"
    return u, why


# ---- per-TP flags -------------------------------------------------------------------------------


def full_chunk_step(cost: CostModel, chunk: int, decodes: int, mean_context: int) -> float:
    """Seconds of a step that carries a prefill chunk filling the budget next to ``decodes``
    running decodes of ``mean_context`` tokens each (the cost model's step time)."""
    prefill = max(1, chunk - decodes)
    return cost.step_time(
        prefill + decodes, decodes + 1, decodes, decodes * mean_context, [(prefill, 0)], decodes
    )


def choose_batched_tokens(
    cost: CostModel,
    default: int,
    decodes: int,
    mean_context: int,
    slo_itl: float | None,
    fixed: int | None = None,
) -> tuple[int, str]:
    if fixed is not None:
        t = full_chunk_step(cost, fixed, decodes, mean_context)
        return fixed, f"set by you; a full-chunk step takes {t * 1e3:.0f} ms"
    if slo_itl is None:
        return default, f"vLLM's default for this GPU ({default}); no ITL SLO to protect"
    choices = [c for c in CHUNK_CHOICES if c <= default and c >= decodes] or [default]
    times = {c: full_chunk_step(cost, c, decodes, mean_context) for c in choices}
    ok = [c for c in choices if times[c] <= slo_itl]
    pick = max(ok) if ok else min(choices)
    why = (
        f"a step that carries a full {pick:,}-token prefill chunk next to {decodes} decodes "
        f"(the requests of mean length the KV cache holds, at context {mean_context:,}) takes "
        f"{times[pick] * 1e3:.0f} ms by the cost model"
    )
    if ok:
        why += f", within the {slo_itl * 1e3:.0f} ms ITL SLO"
        bigger = [c for c in choices if c > pick]
        if bigger:
            b = bigger[0]
            why += f" ({b:,} would take {times[b] * 1e3:.0f} ms)"
        if pick < default:
            why += f"; vLLM's default {default:,} is simulated among the variants"
        else:
            why += " (vLLM's default for this GPU)"
    else:
        why += (
            f", over the {slo_itl * 1e3:.0f} ms ITL SLO even at the smallest chunk: decodes that "
            "share a step with a prefill chunk will see that gap"
        )
    return pick, why


def choose_max_num_seqs(
    cost: CostModel,
    mem: MemoryBreakdown,
    profile: WorkloadProfile,
    default: int,
    slo_itl: float | None,
    batched_tokens: int,
    fixed: int | None = None,
) -> tuple[int, str]:
    fit = mem.max_concurrency(profile.mean_total)
    if fixed is not None:
        return fixed, f"set by you; the KV cache holds {fit:.1f} requests of the mean length"
    ctx = int(profile.mean_prompt + profile.mean_output / 2)
    want = max(MIN_SEQS, 1 << max(0, math.ceil(math.log2(max(fit, 1.0)))))
    pick = min(want, default, batched_tokens)
    why = (
        f"the KV cache of a replica holds {mem.kv_tokens:,} tokens = {fit:.1f} requests of the "
        f"workload's mean {profile.mean_total:,.0f} tokens (prompt + output); rounded up to a "
        f"power of two: {want}"
    )
    if pick < want:
        why += f", capped at {pick} (vLLM's default, and <= max-num-batched-tokens)"
    if slo_itl is not None:
        while pick > MIN_SEQS and cost.decode_step_time(pick, ctx) > slo_itl:
            pick //= 2
        t = cost.decode_step_time(pick, ctx)
        why += (
            f"; a decode step of {pick} sequences at context {ctx:,} takes {t * 1e3:.1f} ms "
            f"(ITL SLO {slo_itl * 1e3:.0f} ms)"
        )
    if pick != default:
        why += (
            f"; more running requests than the KV cache holds would be preempted and recomputed "
            f"(vLLM's default {default} is simulated among the variants)"
        )
    return pick, why


@dataclass(frozen=True, slots=True)
class GlobalFlags:
    max_model_len: int
    max_model_len_reason: str
    block_size: int
    block_size_reason: str
    enable_prefix_caching: bool
    prefix_reason: str
    problem: str | None = None
    """A flag that would refuse part of the declared workload, with the fix."""


def choose_global(
    model: ModelSpec, profile: WorkloadProfile, longest: Longest, overrides: Overrides
) -> GlobalFlags:
    mml, mml_why, problem = choose_max_model_len(model, profile, longest, overrides.max_model_len)
    bs, bs_why = block_size_reason(overrides.block_size)
    pc, pc_why = choose_prefix_caching(profile, bs, overrides.enable_prefix_caching)
    return GlobalFlags(mml, mml_why, bs, bs_why, pc, pc_why, problem)


def choose_flags(
    model: ModelSpec,
    gpu: GPUSpec,
    dtype: str,
    tp: int,
    profile: WorkloadProfile,
    glob: GlobalFlags,
    overrides: Overrides,
    slo_itl: float | None,
) -> Flags:
    """All flags of a replica of ``tp`` GPUs, each with its reason."""
    default_tokens, default_seqs = vllm_default_batch(gpu.name, gpu.memory_bytes)
    kv_dtype = resolve_kv_dtype(overrides.kv_cache_dtype, dtype, gpu)
    cost = CostModel(model, gpu, tp, dtype, kv_dtype=kv_dtype)
    kv_per_token = cost.kv_bytes_per_token
    gmu, gmu_why = utilization_reason(gpu, kv_per_token, overrides.gpu_memory_utilization)

    def memory(tokens: int, seqs: int) -> MemoryBreakdown:
        return plan_memory(model, gpu, tp, dtype, gmu, tokens, seqs, glob.block_size, kv_dtype)

    first = memory(overrides.max_num_batched_tokens or default_tokens, default_seqs)
    fit = first.max_concurrency(profile.mean_total) if first.fits else 1.0
    decodes = max(1, min(default_seqs, math.floor(fit)))
    ctx = int(profile.mean_prompt + profile.mean_output / 2)
    tokens, tokens_why = choose_batched_tokens(
        cost, default_tokens, decodes, ctx, slo_itl, overrides.max_num_batched_tokens
    )
    seqs = default_seqs
    for _ in range(3):  # the sampler's buffers grow with max-num-seqs: settle the KV size
        pick, seqs_why = choose_max_num_seqs(
            cost,
            memory(tokens, seqs),
            profile,
            default_seqs,
            slo_itl,
            tokens,
            overrides.max_num_seqs,
        )
        if pick == seqs:
            break
        seqs = pick
    graph_ms = cost.eff.graph_step_overhead_s * 1e3
    eager_ms = cost.eff.step_overhead_s * 1e3
    return Flags(
        max_model_len=glob.max_model_len,
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
        block_size=glob.block_size,
        gpu_memory_utilization=gmu,
        enable_prefix_caching=glob.enable_prefix_caching,
        enforce_eager=False,
        kv_cache_dtype=overrides.kv_cache_dtype,
        reasons=(
            ("max_model_len", glob.max_model_len_reason),
            ("max_num_batched_tokens", tokens_why),
            ("max_num_seqs", seqs_why),
            ("block_size", glob.block_size_reason),
            ("gpu_memory_utilization", gmu_why),
            ("enable_prefix_caching", glob.prefix_reason),
            (
                "enforce_eager",
                f"off (CUDA graphs on): decode-only steps of up to {CUDA_GRAPH_MAX_BATCH} "
                f"sequences replay a graph, {graph_ms:.1f} ms of overhead per step instead of "
                f"{eager_ms:.1f} ms, for the graphs' memory",
            ),
        ),
    )


def default_flags(gpu: GPUSpec, base: Flags) -> Flags:
    """What ``vllm serve`` does out of the box (with the planner's max-model-len, which vLLM
    would otherwise take from the model and may not fit, and gpu-memory-utilization, which
    follows the GPU family)."""
    tokens, seqs = vllm_default_batch(gpu.name, gpu.memory_bytes)
    return base.with_(
        "vLLM's default",
        max_num_batched_tokens=tokens,
        max_num_seqs=seqs,
        block_size=DEFAULT_BLOCK_SIZE,
        enable_prefix_caching=True,
    )
