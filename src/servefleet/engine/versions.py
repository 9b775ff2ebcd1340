"""Which vLLM release an engine-model prediction is for.

The scheduler, the step-time model and the API-server model reproduce one vLLM release; a
profile names it and the behaviours that differ between releases. Only 0.26 is measured
(benchmarks/real_vllm/, one H200); 0.19 (the last release that runs on V100s, docs/export.md)
is 0.26's model; 0.11 is the same model with vLLM's synchronous engine loop, the last V1 release
before async scheduling became the default (vLLM PR #27614, in 0.12).

Rule: an unknown version is refused with the known ones listed; nothing is guessed.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class VllmProfile:
    version: str
    async_scheduling: bool
    """The engine core schedules step k+1 while step k runs: host work overlaps the GPU's, and a
    request that arrives during step k joins step k+2 (``Scheduler.add_request``)."""
    gpu_memory_utilization: float
    """``vllm serve``'s default ``--gpu-memory-utilization``."""
    basis: str


PROFILES = MappingProxyType(
    {
        "0.26": VllmProfile(
            "0.26",
            async_scheduling=True,
            gpu_memory_utilization=0.92,
            basis="measured: vLLM 0.26.0 on one H200 (docs/validation.md)",
        ),
        "0.19": VllmProfile(
            "0.19",
            async_scheduling=True,
            gpu_memory_utilization=0.9,
            basis="derived: 0.26's costs (async scheduling is the default since 0.12); the last "
            "release that runs on Volta (docs/export.md); not measured",
        ),
        "0.11": VllmProfile(
            "0.11",
            async_scheduling=False,
            gpu_memory_utilization=0.9,
            basis="derived: 0.26's costs with the synchronous engine loop (a step's host work "
            "and GPU work add; an arrival joins the next step); not measured",
        ),
    }
)
DEFAULT_VERSION = "0.26"


def vllm_profile(version: str) -> VllmProfile:
    """The profile of ``version`` (``0.26``, ``0.26.0``, ``v0.11.2`` ...); ValueError otherwise."""
    key = version.strip().lower().removeprefix("v")
    major_minor = ".".join(key.split(".")[:2])
    profile = PROFILES.get(major_minor)
    if profile is None:
        raise ValueError(
            f"no engine-model profile for vLLM {version!r}; known: "
            + ", ".join(f"{p.version} ({p.basis.split(':')[0]})" for p in PROFILES.values())
        )
    return profile
