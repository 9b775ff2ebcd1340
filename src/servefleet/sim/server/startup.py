"""How long `vllm serve` takes to become ready: the sim-server's default ``--startup-time``.

``process + weights_per_gpu / load_rate + profile (+ torch.compile + CUDA-graph capture)``,
plus NCCL set-up under tensor parallelism. The phases are read from the logs of five starts of
vLLM 0.26 serving a 7.6B model (Qwen2.5-7B dimensions, bf16) on one H200 with torch.compile and
CUDA graphs (docs/real-gpu.md, benchmarks/real_vllm/README.md): first starts on a fresh machine
took 107, 110, 153 and 157 s to a healthy /health; a restart with warm import and compile caches
took 84-99 s. Weights were dummy (``--load-format dummy``, 1.7-2.4 s), so the load rate from
disk is still ASSUMED; and vLLM was imported from an unpacked site directory, which may start
slower than a pip install.
"""

from __future__ import annotations

from dataclasses import dataclass

from servefleet.sim.deployment import Deployment

PROCESS_START_S = 60.0
"""Python imports, tokenizer, CUDA context, engine-core process, model init: 61-93 s measured
from `vllm serve` to "Model loading took" on a fresh H200 machine."""
WEIGHT_LOAD_BYTES_PER_S = 1.0e9
"""ASSUMED: safetensors from local disk to GPU, per GPU (GPUs of a TP group load in parallel)."""
PROFILE_AND_KV_INIT_S = 22.0
"""The profiling run, KV-cache allocation, warm-up and API-server start: 19-26 s measured
(vLLM's "init engine" time less compilation and graph capture, plus the tail to ready)."""
TORCH_COMPILE_S = 24.0
"""Dynamo + Inductor compilation with a cold compile cache: 19-29 s measured (5 s warm);
skipped with --enforce-eager."""
CUDA_GRAPH_CAPTURE_S = 6.0
"""Capturing the CUDA graphs (sizes 1-512): 4-7 s measured; skipped with --enforce-eager."""
NCCL_INIT_S = 5.0
"""ASSUMED: NCCL communicator set-up when tensor parallelism > 1."""


@dataclass(frozen=True, slots=True)
class StartupPrediction:
    process: float
    weights: float
    profile: float
    compile: float
    graphs: float
    nccl: float

    @property
    def total(self) -> float:
        return self.process + self.weights + self.profile + self.compile + self.graphs + self.nccl


def predict_startup(dep: Deployment) -> StartupPrediction:
    """Seconds from `vllm serve` to a healthy /health for this deployment (a first start)."""
    weights = dep.memory().weights / WEIGHT_LOAD_BYTES_PER_S
    eager = dep.enforce_eager
    return StartupPrediction(
        process=PROCESS_START_S,
        weights=weights,
        profile=PROFILE_AND_KV_INIT_S,
        compile=0.0 if eager else TORCH_COMPILE_S,
        graphs=0.0 if eager else CUDA_GRAPH_CAPTURE_S,
        nccl=NCCL_INIT_S if dep.tp > 1 else 0.0,
    )


def predicted_startup_seconds(dep: Deployment) -> float:
    return predict_startup(dep).total
