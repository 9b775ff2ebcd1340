"""Workloads: what to send and when, shared by the simulator (virtual clock) and the benchmark
(wall clock). Pure: no clock, no I/O beyond reading workload and dataset files, seeded randomness.

    spec = load_workload("enterprise-mix")          # or a YAML path, or fixed_workload(512, 128)
    source = build_source(spec, seed=0, rate=20.0)  # or concurrency=16
    for req in source.initial(): ...                # RequestSpec in arrival order (maybe endless)
    source.on_finish(req, finish_time, output_tokens)  # -> follow-ups (next turn, closed loop)
"""

from __future__ import annotations

from .datasets import TokenCounter, whitespace_tokens
from .describe import block_reuse, describe_workload
from .errors import WorkloadError
from .load import deep_merge, load_workload, recorded_workload, validate_workload
from .presets import PRESETS
from .preview import dry_run
from .source import build_source, recorded_rate
from .spec import ClassSpec, WorkloadSpec
from .types import RequestSpec, Segment, WorkloadSource, output_key


def fixed_workload(prompt_tokens: int, output_tokens: int, *, rate: float = 1.0) -> WorkloadSpec:
    """One class of fixed lengths (the CLI's ``--input-len/--output-len``), Poisson at ``rate``;
    pass ``rate``/``concurrency`` to ``build_source`` to choose the load."""
    return validate_workload(
        {
            "name": f"fixed-{prompt_tokens}-{output_tokens}",
            "arrival": {"type": "poisson", "rate": rate},
            "classes": {"fixed": {"prompt": prompt_tokens, "output": output_tokens}},
        },
        origin="fixed workload (--input-len/--output-len)",
    )


__all__ = [
    "PRESETS",
    "ClassSpec",
    "RequestSpec",
    "Segment",
    "TokenCounter",
    "WorkloadError",
    "WorkloadSource",
    "WorkloadSpec",
    "block_reuse",
    "build_source",
    "deep_merge",
    "describe_workload",
    "dry_run",
    "fixed_workload",
    "load_workload",
    "output_key",
    "recorded_rate",
    "recorded_workload",
    "validate_workload",
    "whitespace_tokens",
]
