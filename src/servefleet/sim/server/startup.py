"""How long `vllm serve` takes to become ready: the sim-server's default ``--startup-time``.

``process + weights_per_gpu / load_rate + profile (+ torch.compile + CUDA-graph capture)``,
plus NCCL set-up under tensor parallelism. Every constant below is ASSUMED, chosen so that the
one measured case is met: vLLM 0.26 serving a 7.6B model (Qwen2.5-7B dimensions, bf16, 15.2 GB)
on one H200 became healthy after ~84 s with torch.compile and CUDA graphs
(/work/shared/gpu-vllm/README.md). The same run's eager start took ~100 s, but it was the first,
cold start of that machine (empty page cache and import caches), which this model does not
describe; its eager prediction (~45 s) is what a warm start would take, a lower bound.
"""

from __future__ import annotations

from dataclasses import dataclass

from servefleet.sim.deployment import Deployment

PROCESS_START_S = 25.0
"""ASSUMED: Python imports, tokenizer, CUDA context, engine-core and worker processes."""
WEIGHT_LOAD_BYTES_PER_S = 1.0e9
"""ASSUMED: safetensors from local disk to GPU, per GPU (GPUs of a TP group load in parallel)."""
PROFILE_AND_KV_INIT_S = 5.0
"""ASSUMED: the profiling forward pass and KV-cache allocation."""
TORCH_COMPILE_S = 30.0
"""ASSUMED: Dynamo + Inductor compilation with a cold compile cache (skipped with
--enforce-eager)."""
CUDA_GRAPH_CAPTURE_S = 9.0
"""ASSUMED: capturing the decode CUDA graphs (~67 batch sizes; skipped with --enforce-eager)."""
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
    """Seconds from `vllm serve` to a healthy /health for this deployment (assumed constants)."""
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
