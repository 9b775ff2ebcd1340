"""Precision: the dtype the weights run in, and what weight quantization would change.

The dtype itself is ``engine.memory.resolve_dtype`` (the one vLLM's own fallback follows); this
module adds the reason in words and a what-if table of quantized formats: bytes per GPU, the
decode bandwidth bound that follows, and whether vLLM has kernels for the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from servefleet.engine.memory import GiB, resolve_dtype, weight_bytes_per_gpu
from servefleet.hardware import GPUSpec
from servefleet.models import ModelSpec

VLLM_DTYPE = {"fp16": "half", "bf16": "bfloat16", "fp8": "auto", "int8": "auto"}
"""``vllm serve --dtype`` for each weight dtype (fp8/int8 keep 16-bit activations)."""

FOUR_BIT_BYTES_PER_WEIGHT = 0.5 + 2.5 / 128
"""AWQ/GPTQ 4-bit with group size 128: half a byte per weight, plus per group a 16-bit scale
and a packed 4-bit zero point (2.5 bytes / 128 weights)."""


@dataclass(frozen=True, slots=True)
class QuantFormat:
    name: str
    weight_dtype: str | None
    """The engine dtype the simulator can run it as (None: memory arithmetic only)."""
    vllm_flag: str
    min_cc: tuple[int, int]
    """Lowest compute capability with vLLM kernels (vLLM's "supported hardware" table)."""
    speed: str


FORMATS = (
    QuantFormat(
        "int8 (W8A8)",
        "int8",
        "a W8A8 checkpoint (llm-compressor)",
        (7, 5),
        "int8 tensor cores: ~2x the fp16 FLOP/s where the GPU has them",
    ),
    QuantFormat(
        "fp8 (W8A8)",
        "fp8",
        "--quantization fp8",
        (8, 9),
        "fp8 tensor cores (Ada, Hopper); weight-only Marlin fp8 on sm80",
    ),
    QuantFormat(
        "AWQ 4-bit",
        None,
        "an AWQ checkpoint (--quantization awq)",
        (7, 5),
        "W4A16: decode reads ~1/4 of the bytes; prefill still computes in fp16",
    ),
    QuantFormat(
        "GPTQ 4-bit",
        None,
        "a GPTQ checkpoint (--quantization gptq)",
        (7, 0),
        "W4A16: decode reads ~1/4 of the bytes; prefill computes in fp16 plus dequantization",
    ),
)


@dataclass(frozen=True, slots=True)
class PrecisionChoice:
    requested: str
    dtype: str
    stored: str
    reason: str

    @property
    def vllm_dtype(self) -> str:
        return VLLM_DTYPE.get(self.dtype, "auto")

    def to_dict(self) -> dict:
        return {
            "requested": self.requested,
            "dtype": self.dtype,
            "stored": self.stored,
            "vllm_dtype": self.vllm_dtype,
            "reason": self.reason,
        }


def stored_dtype(model: ModelSpec) -> str:
    return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(model.torch_dtype, "bf16")


def choose_precision(model: ModelSpec, gpu: GPUSpec, requested: str = "auto") -> PrecisionChoice:
    dtype, note = resolve_dtype(model, gpu, requested)
    stored = stored_dtype(model)
    if note:
        reason = note
        if stored == "bf16" and dtype == "fp16":
            reason += (
                "; the checkpoint is stored in bf16, so vLLM casts it (bf16 → fp16 keeps the "
                "mantissa but not bf16's range: rare overflows are possible)"
            )
    elif requested == "auto":
        reason = (
            f"the checkpoint is stored in {stored} and {gpu.name} (compute capability "
            f"{'.'.join(map(str, gpu.compute_capability))}) runs {dtype} on its tensor cores"
        )
    else:
        reason = f"{dtype} as requested; {gpu.name} runs it on its tensor cores"
    return PrecisionChoice(requested, dtype, stored, reason)


@dataclass(frozen=True, slots=True)
class QuantOption:
    name: str
    weights_per_gpu: int
    decode_bound_s: float
    """Weights ÷ TP read once at datasheet bandwidth: no decode step is shorter."""
    supported: bool
    simulated: bool
    how: str
    speed: str

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}


def four_bit_weight_bytes(model: ModelSpec) -> int:
    linear = model.num_layers * model.linear_weight_params_per_layer
    other = model.num_params - linear
    return int(linear * FOUR_BIT_BYTES_PER_WEIGHT) + 2 * other


def quantization_options(
    model: ModelSpec, gpu: GPUSpec, tp: int, baseline: str
) -> list[QuantOption]:
    """The baseline dtype and each quantized format at ``tp``: memory, decode bound, support."""
    rows = [
        QuantOption(
            f"{baseline} (chosen)",
            weight_bytes_per_gpu(model, baseline, tp),
            weight_bytes_per_gpu(model, baseline, tp) / gpu.hbm_bandwidth,
            True,
            True,
            f"--dtype {VLLM_DTYPE.get(baseline, 'auto')}",
            "baseline",
        )
    ]
    for f in FORMATS:
        if f.weight_dtype is not None:
            per_gpu = weight_bytes_per_gpu(model, f.weight_dtype, tp)
        else:
            per_gpu = -(-four_bit_weight_bytes(model) // tp)
        supported = gpu.compute_capability >= f.min_cc
        cc = ".".join(map(str, f.min_cc))
        rows.append(
            QuantOption(
                f.name,
                per_gpu,
                per_gpu / gpu.hbm_bandwidth,
                supported,
                f.weight_dtype is not None and f.weight_dtype in gpu.flops,
                f.vllm_flag if supported else f"needs compute capability >= {cc}",
                f.speed,
            )
        )
    return rows


def gib(n: float) -> str:
    return f"{n / GiB:,.2f} GiB"


LOWER_WEIGHTS = ("fp8", "int8")
"""Weight dtypes below the checkpoint's 16 bits that the plan may run."""


def quality_check(
    dtype: str, kv_cache_dtype: str, options: list[QuantOption]
) -> tuple[str, str] | None:
    """When the plan offers a lower precision (fp8 or int8 weights, an fp8 KV cache, a format
    of the what-if table that runs on this GPU): what is offered, and the ``servefleet
    quality`` line that measures what it changes in the answers (docs/quality.md); None
    otherwise."""
    lower = [f"{dtype} weights"] if dtype in LOWER_WEIGHTS else []
    if kv_cache_dtype == "fp8":
        lower.append("an fp8 KV cache")
    formats = {f.name for f in FORMATS}  # the table's other row is the chosen dtype
    lower += [q.name for q in options if q.supported and q.name in formats and dtype not in q.name]
    if not lower:
        return None
    command = (
        "servefleet quality http://REFERENCE:8000 http://CANDIDATE:8000 --prompts prompts.jsonl"
    )
    return ", ".join(lower), command
