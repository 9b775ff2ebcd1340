"""GPU catalog: memory, bandwidth, dense tensor FLOP/s, interconnect and achievable efficiency.

Datasheet numbers (``GPUSpec``) are kept apart from achievable fractions (``Efficiency``); the
latter live in ONE block below (``EFFICIENCY_DEFAULTS`` / ``EFFICIENCY_BY_GPU``) so that a
calibration can replace them. Every figure and its source is listed in ``docs/hardware.md``.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

DTYPES = ("fp16", "bf16", "fp8", "int8")
"""Tensor dtypes a ``GPUSpec.flops`` table may name."""

_DTYPE_ALIASES = {"float16": "fp16", "half": "fp16", "bfloat16": "bf16", "float8": "fp8"}

MiB = 2**20
GB = 1e9
TFLOPS = 1e12


class UnknownGPUError(ValueError):
    """A GPU name that is neither a catalog name nor an alias."""


class GPUFileError(ValueError):
    """A user GPU YAML file that cannot be read or does not validate."""


@dataclass(frozen=True, slots=True)
class Interconnect:
    """How the GPUs of one replica all-reduce (two per layer under tensor parallelism).

    vLLM picks the algorithm by message size (``vllm/distributed/device_communicators``):

    * **one-shot** (its custom all-reduce; needs every pair of the TP group linked peer to
      peer, ``custom_allreduce_max_tp``): each GPU reads every peer's buffer and sums,
      ``latency(tp) + (tp - 1) * bytes / allreduce_bandwidth``; used at TP=2, and at larger
      TP for messages under ``ONESHOT_MAX_BYTES``;
    * **two-shot** (custom 2-stage, symmetric memory or NCCL): reduce-scatter + all-gather,
      ``twoshot_latency_s + 2 (tp - 1) / tp * bytes / allreduce_bandwidth``.
    """

    kind: Literal["nvlink", "pcie", "network"]
    bandwidth: float
    """Bytes/s, unidirectional, per GPU (datasheet link rate, not what NCCL reaches)."""
    latency_s: float
    """One-shot all-reduce of a small message between 2 GPUs, seconds."""
    description: str
    allreduce_eff: float = 0.75
    """Fraction of ``bandwidth`` an all-reduce's transfers reach."""
    latency_per_rank_s: float = 0.3e-6
    """One-shot latency added per GPU beyond 2."""
    twoshot_latency_s: float = 12e-6
    """Fixed time of a two-shot all-reduce."""
    custom_allreduce_max_tp: int = 8
    """Largest TP group whose GPUs are all linked peer to peer (vLLM's custom all-reduce);
    above it every all-reduce goes through NCCL (two-shot form)."""
    source: str = "assumed"

    @property
    def allreduce_bandwidth(self) -> float:
        """Achievable bytes/s of an all-reduce's transfers per GPU."""
        return self.bandwidth * self.allreduce_eff

    def allreduce_time(self, nbytes: float, tp: int) -> float:
        """Seconds for one all-reduce of ``nbytes`` across ``tp`` GPUs (0 at TP=1)."""
        if tp < 2:
            return 0.0
        bw = self.allreduce_bandwidth
        if tp <= self.custom_allreduce_max_tp and nbytes < ONESHOT_MAX_BYTES.get(tp, 0):
            latency = self.latency_s + self.latency_per_rank_s * (tp - 2)
            return latency + (tp - 1) * nbytes / bw
        return self.twoshot_latency_s + 2 * (tp - 1) / tp * nbytes / bw


ONESHOT_MAX_BYTES = MappingProxyType({2: float("inf"), 4: 512 * 1024, 6: 256 * 1024, 8: 256 * 1024})
"""Largest message vLLM's custom all-reduce sends one-shot, by TP (its kernel runs one stage
at 2 GPUs, and below 512 KiB up to 4 / 256 KiB up to 8 GPUs; vLLM 0.26 on sm90 hands larger
messages at TP 6-8 to symmetric memory)."""


@dataclass(frozen=True, slots=True)
class Efficiency:
    """Achievable fractions of datasheet numbers (kept apart from the datasheet), with their source."""

    gemm_max: float
    gemm_half_tokens: float
    weight_bw: float
    attn_prefill: float
    attn_decode_bw: float
    kernel_floor_s: float
    step_overhead_s: float
    graph_step_overhead_s: float
    per_seq_overhead_s: float
    source: str
    host_step_s: float = 0.0
    """CPU time of the engine per step (schedule, prepare inputs, process outputs). With async
    scheduling it overlaps the GPU's work (a step takes the longer of the two); together with
    ``per_seq_overhead_s`` per sequence it is the host's share of a step."""
    attn_prefill_floor_s: float = 13e-6
    """Fixed time of a layer's attention kernel in a step that has prefill chunks."""
    attn_decode_floor_s: float = 11e-6
    """Fixed time of a layer's attention kernel in a decode-only step."""
    request_latency_s: float = 0.0
    """Fixed delay between a request's admission by the API server and the scheduler (IPC to
    the engine core, fixed costs off the API server's CPU): added once to TTFT."""
    frontend_request_s: float = 0.0
    """API-server CPU time to admit a request (HTTP, rendering, set-up). The API server's one
    CPU is shared in turn by the requests it admits and the chunks it streams
    (``servefleet.sim.frontend``)."""
    frontend_prompt_token_s: float = 0.0
    """API-server CPU time per prompt token of a request it admits (tokenization)."""
    frontend_chunk_s: float = 0.0
    """API-server CPU time per stream chunk sent to a client (one request's new tokens of one
    or more engine steps: output processing, detokenization, SSE)."""
    gpu_share_switch_s: float = 0.6e-3
    """Time lost each time a GPU shared by several vLLM processes turns from one's step to
    another's (CUDA time-slices contexts). Fitted on real vLLM 0.26, two replicas on one H200
    at concurrency 8 (docs/real-gpu.md); assumed the same on other GPUs."""

    def gemm(self, num_tokens: float) -> float:
        """GEMM efficiency at ``num_tokens`` rows: ``gemm_max * M / (M + gemm_half_tokens)``."""
        if num_tokens <= 0:
            return 0.0
        return self.gemm_max * num_tokens / (num_tokens + self.gemm_half_tokens)


class FlopsTable(Mapping[str, float]):
    """Immutable, hashable dtype -> dense FLOP/s table (so that ``GPUSpec`` stays hashable)."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, float]) -> None:
        self._items = {str(k): float(v) for k, v in items.items()}

    def __getitem__(self, key: str) -> float:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self._items) == dict(other)

    def __repr__(self) -> str:
        return f"FlopsTable({self._items!r})"


def canonical_dtype(dtype: str) -> str:
    """``"bfloat16"`` -> ``"bf16"``, ``"float16"`` -> ``"fp16"``; other names lower-cased."""
    key = dtype.strip().lower()
    return _DTYPE_ALIASES.get(key, key)


@dataclass(frozen=True, slots=True)
class GPUSpec:
    name: str
    aliases: tuple[str, ...]
    memory_bytes: int
    """Total device memory as CUDA reports it (``torch.cuda.mem_get_info()[1]``)."""
    hbm_bandwidth: float
    flops: Mapping[str, float]
    """Dense (no sparsity) tensor FLOP/s per dtype; an absent dtype is unsupported."""
    bf16: bool
    compute_capability: tuple[int, int]
    interconnect: Interconnect
    efficiency: Efficiency
    attention_backend: str
    datasheet: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "flops", FlopsTable(self.flops))
        object.__setattr__(self, "aliases", tuple(self.aliases))
        object.__setattr__(self, "compute_capability", tuple(self.compute_capability))
        unknown = sorted(set(self.flops) - set(DTYPES))
        if unknown or not self.flops:
            raise ValueError(f"GPU {self.name}: flops keys must be among {DTYPES}, got {unknown}")
        if self.bf16 != ("bf16" in self.flops):
            raise ValueError(f"GPU {self.name}: bf16={self.bf16} disagrees with its flops table")

    @property
    def supported_dtypes(self) -> tuple[str, ...]:
        return tuple(d for d in DTYPES if d in self.flops)

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / 2**30

    def supports(self, dtype: str) -> bool:
        return canonical_dtype(dtype) in self.flops

    def peak_flops(self, dtype: str) -> float:
        """Dense datasheet tensor FLOP/s for ``dtype``; ValueError if the GPU lacks it."""
        key = canonical_dtype(dtype)
        if key not in self.flops:
            raise ValueError(
                f"GPU {self.name} has no {dtype} tensor support; supported dtypes: "
                f"{', '.join(self.supported_dtypes)}"
            )
        return self.flops[key]

    def with_efficiency(self, efficiency: Efficiency) -> GPUSpec:
        """The same GPU with calibrated efficiency figures."""
        return replace(self, efficiency=efficiency)


# ==============================================================================================
# EFFICIENCY DEFAULTS — the one block a calibration replaces.
# Keys of EFFICIENCY_DEFAULTS are attention-backend families; EFFICIENCY_BY_GPU holds per-GPU
# calibrated figures (canonical GPU name -> Efficiency) and wins over the family default.
# All numbers below are ASSUMPTIONS until a committed measurement replaces them.
# ==============================================================================================
_H200_SOURCE = (
    "measured: kernels fitted in the 'floor + roofline' form to benchmarks/calibration/data/"
    "h200_fit.json (bf16 GEMMs of 4 models x 14 token counts; vLLM 0.26's FA3 attention); "
    "per-step and per-request overheads fitted to real vLLM 0.26 serving, the API server's "
    "CPU costs derived from its /metrics (benchmarks/real_vllm/, docs/validation.md)"
)
H200_MEASURED = Efficiency(
    gemm_max=0.7455,
    gemm_half_tokens=2.21,
    weight_bw=0.848,
    attn_prefill=0.549,
    attn_decode_bw=0.868,
    kernel_floor_s=4.14e-6,
    step_overhead_s=8.46e-3,
    graph_step_overhead_s=0.35e-3,
    per_seq_overhead_s=24.9e-6,
    host_step_s=2.16e-3,
    attn_prefill_floor_s=13.1e-6,
    attn_decode_floor_s=11.0e-6,
    request_latency_s=4.03e-3,
    frontend_request_s=1.34e-3,
    frontend_prompt_token_s=1.17e-6,
    frontend_chunk_s=64e-6,
    source=_H200_SOURCE,
)
EFFICIENCY_DEFAULTS: Mapping[str, Efficiency] = MappingProxyType(
    {
        # Other FlashAttention GPUs: the H200's measured fractions, applied to their own
        # datasheet (the cost model multiplies them by each GPU's peak FLOP/s and bandwidth).
        "FLASH_ATTN": replace(
            H200_MEASURED,
            source="scaled: the H200's measured fractions applied to this GPU's datasheet "
            "(not measured on this GPU)",
        ),
        # sm70/sm75: vLLM runs its Triton attention (no FlashAttention) and older tensor cores;
        # GEMM fractions from the H200, attention and overheads assumed slower.
        "TRITON_ATTN": replace(
            H200_MEASURED,
            gemm_max=0.65,
            attn_prefill=0.25,
            attn_decode_bw=0.5,
            attn_prefill_floor_s=20e-6,
            attn_decode_floor_s=16e-6,
            step_overhead_s=3.0e-3,
            graph_step_overhead_s=0.6e-3,
            per_seq_overhead_s=8e-6,
            source="assumed: the H200's GEMM bandwidth fraction with an older tensor-core "
            "maximum, slower Triton attention and host overheads (not measured on this GPU)",
        ),
    }
)
EFFICIENCY_BY_GPU: Mapping[str, Efficiency] = MappingProxyType({"H200-SXM": H200_MEASURED})
"""Calibrated per-GPU efficiency; wins over the family default."""

_BACKEND_FAMILY = MappingProxyType(
    {
        "FLASH_ATTN": "FLASH_ATTN",
        "FLASHINFER": "FLASH_ATTN",
        "TRITON_ATTN": "TRITON_ATTN",
        "XFORMERS": "TRITON_ATTN",
        "FLEX_ATTENTION": "TRITON_ATTN",
    }
)
# ==============================================================================================


def default_efficiency(attention_backend: str) -> Efficiency:
    """The assumed efficiency of the backend's family; ValueError for an unknown backend."""
    family = _BACKEND_FAMILY.get(attention_backend.strip().upper())
    if family is None:
        raise ValueError(
            f"unknown attention_backend {attention_backend!r}; known: {', '.join(_BACKEND_FAMILY)}"
        )
    return EFFICIENCY_DEFAULTS[family]


def _efficiency_for(name: str, attention_backend: str) -> Efficiency:
    return EFFICIENCY_BY_GPU.get(name) or default_efficiency(attention_backend)


# ---- interconnects ----------------------------------------------------------------------------
# NVLink 4 (H100/H200, NVSwitch: all 8 GPUs linked) is derived from kernel-level data measured
# on H100s (docs/hardware.md, "All-reduce"): one-shot latency 4.0 us + 0.3 us per GPU beyond 2
# (SGLang PR #2904's custom all-reduce, 512 B - 32 KiB: 3.7-4.5 / 3.7-4.8 / 5.7-7.8 us at TP
# 2/4/8); 370 GB/s of the 450 GB/s link rate (NCCL's maintainer, nccl-tests issue #212), which
# reproduces vLLM's one-shot custom all-reduce at TP=4 (vLLM PR #24532: 10/14/23/38 us at
# 0.5/1/2/4 MiB; modelled 8.9/15.9/27/38.6); two-shot 12 us fixed (vLLM PRs #24532/#24111:
# symmetric-memory two-shot / multimem intercepts 11-14 us). Other links keep those latencies and
# the same fraction of their own rate: assumed.
_DERIVED_NVLINK4 = (
    "derived: vLLM/SGLang all-reduce micro-benchmarks on H100 NVLink "
    "(vLLM PRs #24532, #24111; SGLang PR #2904; nccl-tests #212)"
)
_ASSUMED_LINK = "assumed: NVLink 4's derived latencies and efficiency applied to this link"
_PCIE3 = Interconnect(
    "pcie", 15.75 * GB, 25e-6, "PCIe 3.0 x16 (8 GT/s, 128b/130b)", 0.7,
    twoshot_latency_s=25e-6, custom_allreduce_max_tp=2, source=_ASSUMED_LINK,
)  # fmt: skip
_PCIE4 = Interconnect(
    "pcie", 31.5 * GB, 25e-6, "PCIe 4.0 x16 (16 GT/s, 128b/130b)", 0.7,
    twoshot_latency_s=25e-6, custom_allreduce_max_tp=2, source=_ASSUMED_LINK,
)  # fmt: skip
_PCIE4_NO_P2P = Interconnect(
    "pcie", 31.5 * GB, 40e-6, "PCIe 4.0 x16, no peer-to-peer (GeForce): all-reduce via host", 0.45,
    twoshot_latency_s=40e-6, custom_allreduce_max_tp=0, source=_ASSUMED_LINK,
)  # fmt: skip
_NVLINK2 = Interconnect(
    "nvlink", 100 * GB, 4.0e-6,
    "NVLink 2.0 hybrid cube-mesh (DGX-1/HGX-1 V100 SXM2): 6 links x 25 GB/s per direction, 4 of "
    "them to the other GPUs of its quad; all 4 GPUs of a quad are linked, 8 are not",
    0.82, custom_allreduce_max_tp=4, source=_ASSUMED_LINK,
)  # fmt: skip
_NVLINK3 = Interconnect(
    "nvlink", 300 * GB, 4.0e-6, "NVLink 3.0, 12 links x 25 GB/s per direction (600 GB/s bidir)",
    0.82, source=_ASSUMED_LINK,
)  # fmt: skip
_NVLINK4 = Interconnect(
    "nvlink", 450 * GB, 4.0e-6, "NVLink 4.0, 18 links x 25 GB/s per direction (900 GB/s bidir)",
    0.82, source=_DERIVED_NVLINK4,
)  # fmt: skip

CROSS_HOST = Interconnect(
    "network", 25 * GB, 30e-6,
    "between hosts: InfiniBand HDR 200 Gb/s, one NIC per GPU (a tensor-parallel group that "
    "spans hosts all-reduces through NCCL at the slowest link's rate)",
    0.7, twoshot_latency_s=30e-6, custom_allreduce_max_tp=0,
    source="assumed: HDR InfiniBand link rate, NCCL two-shot latency across hosts",
)  # fmt: skip
"""The link of a tensor-parallel group that spans hosts (``servefleet plan --hosts``)."""

_DS_V100 = "NVIDIA Tesla V100 GPU Accelerator datasheet (v100-datasheet-us-nvidia-1446566, 2018)"
_DS_A100 = "NVIDIA A100 Tensor Core GPU datasheet (nvidia-a100-datasheet-us-nvidia-1758950, 2021)"
_DS_H100 = "NVIDIA H100 Tensor Core GPU datasheet (2023)"


def _gpu(
    name: str,
    aliases: tuple[str, ...],
    *,
    memory_bytes: int,
    hbm_bandwidth: float,
    flops: dict[str, float],
    cc: tuple[int, int],
    interconnect: Interconnect,
    datasheet: str,
) -> GPUSpec:
    """Build a builtin GPU: sm80+ uses FLASH_ATTN, older ones TRITON_ATTN."""
    backend = "FLASH_ATTN" if cc >= (8, 0) else "TRITON_ATTN"
    return GPUSpec(
        name=name,
        aliases=aliases,
        memory_bytes=memory_bytes,
        hbm_bandwidth=hbm_bandwidth,
        flops=flops,
        bf16="bf16" in flops,
        compute_capability=cc,
        interconnect=interconnect,
        efficiency=_efficiency_for(name, backend),
        attention_backend=backend,
        datasheet=datasheet,
    )


def _tflops(fp16: float, *, bf16: bool = True, fp8: float = 0, int8: float = 0) -> dict[str, float]:
    """A dense FLOP/s table from TFLOP/s figures; bf16 runs at the fp16 rate where supported."""
    table = {"fp16": fp16, "bf16": fp16 if bf16 else 0, "fp8": fp8, "int8": int8}
    return {k: v * TFLOPS for k, v in table.items() if v}


# Memory is what CUDA reports (torch.cuda.mem_get_info()[1]); docs/hardware.md gives each source.
_V100_32G_BYTES = 34_089_730_048  # 32510.5 MiB on V100 32GB, SXM2 and PCIe alike


def _builtin_specs() -> tuple[GPUSpec, ...]:
    return (
        _gpu(
            "V100-SXM2-32G",
            ("v100", "v100-32g", "v100-sxm2", "v100-sxm2-32gb", "tesla-v100-sxm2-32gb"),
            memory_bytes=_V100_32G_BYTES,
            hbm_bandwidth=900 * GB,
            flops=_tflops(125, bf16=False),
            cc=(7, 0),
            interconnect=_NVLINK2,
            datasheet=_DS_V100,
        ),
        _gpu(
            "V100-PCIE-32G",
            ("v100-pcie", "v100-pcie-32gb", "tesla-v100-pcie-32gb"),
            memory_bytes=_V100_32G_BYTES,
            hbm_bandwidth=900 * GB,
            flops=_tflops(112, bf16=False),
            cc=(7, 0),
            interconnect=_PCIE3,
            datasheet=_DS_V100,
        ),
        _gpu(
            "V100-16G",
            ("v100-sxm2-16g", "v100-sxm2-16gb", "tesla-v100-sxm2-16gb"),
            memory_bytes=16_945_512_448,  # 16160.5 MiB
            hbm_bandwidth=900 * GB,
            flops=_tflops(125, bf16=False),
            cc=(7, 0),
            interconnect=_NVLINK2,
            datasheet=_DS_V100,
        ),
        _gpu(
            "T4",
            ("tesla-t4", "t4-16g"),
            memory_bytes=15_095 * MiB,
            hbm_bandwidth=320 * GB,
            flops=_tflops(65, bf16=False, int8=130),
            cc=(7, 5),
            interconnect=_PCIE3,
            datasheet="NVIDIA T4 Tensor Core GPU datasheet (2019)",
        ),
        _gpu(
            "A10",
            ("a10-24g",),
            memory_bytes=22_723 * MiB,
            hbm_bandwidth=600 * GB,
            flops=_tflops(125, int8=250),
            cc=(8, 6),
            interconnect=_PCIE4,
            datasheet="NVIDIA A10 Tensor Core GPU datasheet (2021)",
        ),
        _gpu(
            "A100-40G-SXM",
            ("a100-40g", "a100-40gb", "a100-sxm4-40gb"),
            memory_bytes=40_536 * MiB,
            hbm_bandwidth=1555 * GB,
            flops=_tflops(312, int8=624),
            cc=(8, 0),
            interconnect=_NVLINK3,
            datasheet=_DS_A100,
        ),
        _gpu(
            "A100-80G-SXM",
            ("a100", "a100-80g", "a100-80gb", "a100-sxm4-80gb"),
            memory_bytes=81_251 * MiB,
            hbm_bandwidth=2039 * GB,
            flops=_tflops(312, int8=624),
            cc=(8, 0),
            interconnect=_NVLINK3,
            datasheet=_DS_A100,
        ),
        _gpu(
            "L40S",
            ("l40s-48g",),
            memory_bytes=45_589 * MiB,
            hbm_bandwidth=864 * GB,
            flops=_tflops(362.05, fp8=733, int8=733),
            cc=(8, 9),
            interconnect=_PCIE4,
            datasheet="NVIDIA L40S GPU datasheet (2023)",
        ),
        _gpu(
            "RTX-4090",
            ("4090", "rtx4090", "geforce-rtx-4090"),
            memory_bytes=24_563 * MiB,
            hbm_bandwidth=1008 * GB,
            flops=_tflops(165.2, fp8=330.3, int8=660.6),  # FP32-accumulate rates
            cc=(8, 9),
            interconnect=_PCIE4_NO_P2P,
            datasheet="NVIDIA Ada GPU Architecture whitepaper v2.1 (RTX 4090)",
        ),
        _gpu(
            "H100-SXM",
            ("h100", "h100-80g", "h100-sxm5", "h100-80gb-hbm3"),
            memory_bytes=81_090 * MiB,
            hbm_bandwidth=3350 * GB,
            flops=_tflops(989.4, fp8=1978.9, int8=1978.9),
            cc=(9, 0),
            interconnect=_NVLINK4,
            datasheet=_DS_H100,
        ),
        _gpu(
            "H200-SXM",
            ("h200", "h200-141g", "h200-sxm-141gb"),
            memory_bytes=150_109_880_320,  # measured: 143155.94 MiB (nvidia-smi: 143771 MiB)
            hbm_bandwidth=4800 * GB,
            flops=_tflops(989.4, fp8=1978.9, int8=1978.9),
            cc=(9, 0),
            interconnect=_NVLINK4,
            datasheet="NVIDIA H200 Tensor Core GPU datasheet (2024)",
        ),
    )


def _key(name: str) -> str:
    """Lookup key: lower case, spaces and underscores as dashes."""
    return "-".join(name.strip().lower().replace("_", " ").split())


_VENDOR_PREFIXES = ("nvidia-", "tesla-")


class GPUCatalog:
    """An immutable set of GPUs, looked up case-insensitively by name or alias."""

    __slots__ = ("_index", "_specs")

    def __init__(self, specs: tuple[GPUSpec, ...] | list[GPUSpec]) -> None:
        self._specs: tuple[GPUSpec, ...] = tuple(specs)
        self._index: Mapping[str, GPUSpec] = MappingProxyType(_build_index(self._specs))

    @classmethod
    def builtin(cls) -> GPUCatalog:
        return _builtin_catalog()

    def with_specs(self, specs: list[GPUSpec] | tuple[GPUSpec, ...]) -> GPUCatalog:
        """A new catalog with ``specs`` added; a spec with an existing name replaces it."""
        new_names = {_key(s.name) for s in specs}
        kept = [s for s in self._specs if _key(s.name) not in new_names]
        return GPUCatalog([*kept, *specs])

    def with_yaml(self, path: str | Path) -> GPUCatalog:
        """A new catalog with the GPUs of a user YAML file added (see docs/hardware.md)."""
        specs = load_gpu_yaml(path)
        try:
            return self.with_specs(specs)
        except ValueError as exc:
            raise GPUFileError(f"{path}: {exc}") from exc

    def get(self, name: str) -> GPUSpec:
        key = _key(name)
        spec = self._index.get(key)
        for prefix in _VENDOR_PREFIXES:
            if spec is None and key.startswith(prefix):
                spec = self._index.get(key.removeprefix(prefix))
        if spec is None:
            raise UnknownGPUError(self._unknown_message(name))
        return spec

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        try:
            self.get(name)
        except UnknownGPUError:
            return False
        return True

    def names(self) -> list[str]:
        return [s.name for s in self._specs]

    def __iter__(self) -> Iterator[GPUSpec]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def _unknown_message(self, name: str) -> str:
        close = difflib.get_close_matches(_key(name), list(self._index), n=1, cutoff=0.4)
        hint = f" Did you mean {self._index[close[0]].name!r}?" if close else ""
        return (
            f"unknown GPU {name!r}.{hint} Known GPUs: {', '.join(self.names())}. "
            "Add your own with a GPU YAML file (docs/hardware.md)."
        )


def _build_index(specs: tuple[GPUSpec, ...]) -> dict[str, GPUSpec]:
    index: dict[str, GPUSpec] = {}
    for spec in specs:
        for label in (spec.name, *spec.aliases):
            key = _key(label)
            other = index.get(key)
            if other is not None and other.name != spec.name:
                raise ValueError(
                    f"GPU name or alias {label!r} of {spec.name} is taken by {other.name}"
                )
            index[key] = spec
    return index


@cache
def _builtin_catalog() -> GPUCatalog:
    return GPUCatalog(_builtin_specs())


# ---- user YAML ---------------------------------------------------------------------------------


class _InterconnectModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["nvlink", "pcie"]
    bandwidth: float = Field(gt=0)
    latency_s: float = Field(ge=0)
    description: str = ""
    allreduce_eff: float = Field(0.75, gt=0, le=1)
    latency_per_rank_s: float = Field(0.3e-6, ge=0)
    twoshot_latency_s: float = Field(12e-6, ge=0)
    custom_allreduce_max_tp: int = Field(8, ge=0)
    source: str = "user-supplied"


class _EfficiencyModel(BaseModel):
    """Every field optional: unset ones come from the default of the GPU's attention backend."""

    model_config = ConfigDict(extra="forbid")
    gemm_max: float | None = Field(None, gt=0, le=1)
    gemm_half_tokens: float | None = Field(None, ge=0)
    weight_bw: float | None = Field(None, gt=0, le=1)
    attn_prefill: float | None = Field(None, gt=0, le=1)
    attn_decode_bw: float | None = Field(None, gt=0, le=1)
    kernel_floor_s: float | None = Field(None, ge=0)
    step_overhead_s: float | None = Field(None, ge=0)
    graph_step_overhead_s: float | None = Field(None, ge=0)
    per_seq_overhead_s: float | None = Field(None, ge=0)
    source: str | None = None


class _GPUModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1)
    aliases: list[str] = []
    memory_bytes: int = Field(gt=0)
    hbm_bandwidth: float = Field(gt=0)
    flops: dict[Literal["fp16", "bf16", "fp8", "int8"], float] = Field(min_length=1)
    bf16: bool | None = None
    compute_capability: tuple[int, int]
    interconnect: _InterconnectModel
    efficiency: _EfficiencyModel | None = None
    attention_backend: str = "FLASH_ATTN"
    datasheet: str = "user-supplied"

    @field_validator("flops")
    @classmethod
    def _positive(cls, value: dict[str, float]) -> dict[str, float]:
        bad = [k for k, v in value.items() if v <= 0]
        if bad:
            raise ValueError(f"FLOP/s must be > 0 (dtypes {bad})")
        return value

    @field_validator("attention_backend")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        default_efficiency(value)
        return value.strip().upper()


class _GPUFileModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    gpus: list[_GPUModel]


def _to_spec(model: _GPUModel, path: Path) -> GPUSpec:
    bf16 = "bf16" in model.flops if model.bf16 is None else model.bf16
    return GPUSpec(
        name=model.name,
        aliases=tuple(model.aliases),
        memory_bytes=model.memory_bytes,
        hbm_bandwidth=model.hbm_bandwidth,
        flops=dict(model.flops),
        bf16=bf16,
        compute_capability=model.compute_capability,
        interconnect=Interconnect(**model.interconnect.model_dump()),
        efficiency=_merge_efficiency(model.efficiency, model.attention_backend, path),
        attention_backend=model.attention_backend,
        datasheet=model.datasheet,
    )


def _merge_efficiency(given: _EfficiencyModel | None, backend: str, path: Path) -> Efficiency:
    base = default_efficiency(backend)
    if given is None:
        return base
    values = {k: v for k, v in given.model_dump().items() if v is not None}
    values.setdefault("source", f"user: {path} (unset fields: {base.source})")
    return replace(base, **values)


def _format_validation(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"]).lstrip(".")
        parts.append(f"{loc or '<top>'}: {err['msg']}")
    return "; ".join(parts)


def _read_yaml(path: Path) -> Any:
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise GPUFileError(f"cannot read GPU file {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise GPUFileError(f"GPU file {path} is not valid YAML: {exc}") from exc
    if raw is None:
        raise GPUFileError(f"GPU file {path} is empty; expected a list of GPUs (docs/hardware.md)")
    return {"gpus": raw} if isinstance(raw, list) else raw


def load_gpu_yaml(path: str | Path) -> list[GPUSpec]:
    """Read a user GPU YAML file (a list of GPUs, or ``gpus:`` with the list) into specs."""
    path = Path(path)
    raw = _read_yaml(path)
    try:
        parsed = _GPUFileModel.model_validate(raw)
        specs = [_to_spec(m, path) for m in parsed.gpus]
    except ValidationError as exc:
        raise GPUFileError(f"invalid GPU file {path}: {_format_validation(exc)}") from exc
    except ValueError as exc:
        raise GPUFileError(f"invalid GPU file {path}: {exc}") from exc
    try:
        _build_index(tuple(specs))
    except ValueError as exc:
        raise GPUFileError(f"invalid GPU file {path}: {exc}") from exc
    if len({_key(s.name) for s in specs}) != len(specs):
        raise GPUFileError(f"invalid GPU file {path}: a GPU name appears twice")
    return specs


def get_gpu(name: str) -> GPUSpec:
    """Shortcut for ``GPUCatalog.builtin().get(name)``."""
    return GPUCatalog.builtin().get(name)


# ---- what each figure rests on, and its plausible range ----------------------------------------


@dataclass(frozen=True, slots=True)
class Band:
    """The plausible range of one engine-model parameter of one GPU, and what it rests on.

    ``basis`` is ``measured`` (fitted on this GPU: no band), ``derived`` (computed from cited
    kernel-level data of this GPU) or ``assumed`` (carried over from another GPU or guessed).
    ``low``/``high`` bracket the parameter's value; the nominal value is the catalog's.
    """

    low: float
    high: float
    basis: Literal["measured", "derived", "assumed"]
    source: str

    def __post_init__(self) -> None:
        if not self.low <= self.high:
            raise ValueError(f"band low {self.low} > high {self.high}")


BANDED_PARAMETERS = (
    "efficiency.gemm_max",
    "efficiency.weight_bw",
    "efficiency.attn_prefill",
    "efficiency.attn_decode_bw",
    "efficiency.step_overhead_s",
    "interconnect.latency_s",
    "interconnect.allreduce_eff",
)
"""Parameters that ``parameter_bands`` may give a range for (``section.field`` of a GPUSpec)."""

# Relative ranges (low factor, high factor) applied to the nominal value of a parameter that
# is not measured on the GPU: ASSUMED unless a derivation below replaces them for that GPU.
_ASSUMED_RELATIVE_RANGE: Mapping[str, tuple[float, float]] = MappingProxyType(
    {
        "efficiency.gemm_max": (0.85, 1.10),
        "efficiency.weight_bw": (0.90, 1.05),
        "efficiency.attn_prefill": (0.70, 1.30),
        "efficiency.attn_decode_bw": (0.75, 1.15),
        "efficiency.step_overhead_s": (0.60, 1.60),
        "interconnect.latency_s": (0.80, 3.00),
        "interconnect.allreduce_eff": (0.70, 1.05),
    }
)


@dataclass(frozen=True, slots=True)
class _Derived:
    low: float
    high: float
    source: str


_NVLINK4_BANDS = {
    # SGLang PR #2904: 3.7-4.5 us at TP=2, 3.7-4.8 us at TP=4 (small messages, no CUDA graph:
    # the top of the range includes a launch); vLLM PR #24532's TP=4 one-shot times are met
    # within 20 % by 0.70-0.95 of the link rate.
    "interconnect.latency_s": _Derived(0.80, 1.15, _DERIVED_NVLINK4),
    "interconnect.allreduce_eff": _Derived(0.85, 1.15, _DERIVED_NVLINK4),
}
_SAME_SILICON = (
    "derived: the same SM90 GPU as the measured H200 (same clocks and tensor cores; HBM3 "
    "instead of HBM3e): kernel fractions carry over within the H200's own run-to-run spread "
    "(docs/calibration-data.md: 8192^3 GEMM 701 vs 769-798 TFLOP/s on other days)"
)
_V100_HBM = (
    "derived: V100 global-memory bandwidth measured at 750 of 900 GB/s = 0.83 (Jia et al., "
    "'Dissecting the NVIDIA Volta GPU Architecture via Microbenchmarking', arXiv:1804.06826, 2018)"
)
_DERIVED_BANDS: Mapping[str, Mapping[str, _Derived]] = MappingProxyType(
    {
        "H200-SXM": MappingProxyType(_NVLINK4_BANDS),
        "H100-SXM": MappingProxyType(
            {
                **_NVLINK4_BANDS,
                "efficiency.gemm_max": _Derived(0.92, 1.08, _SAME_SILICON),
                "efficiency.weight_bw": _Derived(0.92, 1.04, _SAME_SILICON),
                "efficiency.attn_prefill": _Derived(0.90, 1.08, _SAME_SILICON),
                "efficiency.attn_decode_bw": _Derived(0.92, 1.04, _SAME_SILICON),
            }
        ),
        "V100-SXM2-32G": MappingProxyType(
            {"efficiency.weight_bw": _Derived(0.95, 1.02, _V100_HBM)}
        ),
        "V100-PCIE-32G": MappingProxyType(
            {"efficiency.weight_bw": _Derived(0.95, 1.02, _V100_HBM)}
        ),
        "V100-16G": MappingProxyType({"efficiency.weight_bw": _Derived(0.95, 1.02, _V100_HBM)}),
    }
)
"""Per-GPU ranges derived from cited kernel-level data (docs/hardware.md), relative to the
catalog value; they replace the assumed range of that parameter on that GPU."""


def parameter_value(gpu: GPUSpec, name: str) -> float:
    """The catalog value of a banded parameter, e.g. ``"interconnect.latency_s"``."""
    section, field = name.split(".", 1)
    return float(getattr(getattr(gpu, section), field))


def parameter_bands(gpu: GPUSpec) -> Mapping[str, Band]:
    """``parameter -> Band`` for every parameter of ``gpu`` the model does not rest on a
    measurement of this GPU for. An empty mapping means every banded figure is measured.

    Rule: efficiency figures are measured only where ``EFFICIENCY_BY_GPU`` holds a calibration
    of this GPU; interconnect figures (collective latency, all-reduce efficiency) are never
    measured (no multi-GPU machine was lent). A figure derived from cited kernel-level data
    of this GPU (``_DERIVED_BANDS``) gets that range; every other one the assumed range.
    """
    measured_eff = gpu.name in EFFICIENCY_BY_GPU and gpu.efficiency is EFFICIENCY_BY_GPU[gpu.name]
    derived = _DERIVED_BANDS.get(gpu.name, {})
    bands: dict[str, Band] = {}
    for name in BANDED_PARAMETERS:
        if name.startswith("efficiency.") and measured_eff:
            continue
        d = derived.get(name)
        lo, hi = (d.low, d.high) if d else _ASSUMED_RELATIVE_RANGE[name]
        value = parameter_value(gpu, name)
        high = value * hi
        if not name.endswith("_s"):  # a fraction of a datasheet figure stays <= 1
            high = min(high, 1.0)
        basis = "derived" if d else "assumed"
        source = d.source if d else _band_source(gpu, name)
        bands[name] = Band(value * lo, max(high, value * lo), basis, source)
    return MappingProxyType(bands)


def _band_source(gpu: GPUSpec, name: str) -> str:
    if name.startswith("interconnect."):
        return (
            f"{gpu.interconnect.source}; {gpu.interconnect.description}; no multi-GPU measurement"
        )
    return gpu.efficiency.source


def with_parameters(gpu: GPUSpec, values: Mapping[str, float]) -> GPUSpec:
    """The same GPU with some banded parameters replaced (``{"interconnect.latency_s": 2e-5}``)."""
    eff: dict[str, float] = {}
    link: dict[str, float] = {}
    for name, value in values.items():
        if name not in BANDED_PARAMETERS:
            raise ValueError(f"unknown parameter {name!r}; known: {', '.join(BANDED_PARAMETERS)}")
        section, field = name.split(".", 1)
        (eff if section == "efficiency" else link)[field] = float(value)
    return replace(
        gpu,
        efficiency=replace(gpu.efficiency, **eff) if eff else gpu.efficiency,
        interconnect=replace(gpu.interconnect, **link) if link else gpu.interconnect,
    )
