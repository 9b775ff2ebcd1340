"""The simulator's results, pinned: a digest of every record, step log and counter of a few
short runs. A change to the engine or the fleet loop that is meant to be exact must keep them;
one that changes the model changes them on purpose (recompute with
``python tests/test_sim_golden.py``).
benchmarks/sim_equivalence.py compares longer runs field by field. The step log digested is
its start, end and delivery times and its peak KV usage."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest

from servefleet.hardware import get_gpu
from servefleet.models import load_model
from servefleet.routing import make_policy
from servefleet.sim.cluster import ClusterSim
from servefleet.sim.deployment import resolve_deployment
from servefleet.sim.runner import build_replicas
from servefleet.workload import build_source, load_workload

SHARED_SYSTEM_PROMPT = {
    "classes": {
        "qa": {"system_prompt": {"tokens": 600, "share": 0.8, "groups": 3}},
        "summaries": {"system_prompt": {"tokens": 300, "share": 0.5, "groups": 2, "name": "doc"}},
    }
}

SCENARIOS = {
    # name: (deployment, workload overrides, load, seconds, async scheduling)
    "seed-closed": (
        dict(model="Qwen1.5-14B", gpu="V100-SXM2-32G", tp=2, num_gpus=8, max_model_len=4096),
        ("chat-3tier", None),
        dict(concurrency=512),
        20,
        True,
    ),
    "seed-open-enterprise-shared": (
        dict(model="Qwen1.5-14B", gpu="V100-SXM2-32G", tp=2, num_gpus=8, max_model_len=4096),
        ("enterprise-mix", SHARED_SYSTEM_PROMPT),
        dict(rate=30.0),
        20,
        True,
    ),
    "overload-preempts": (
        dict(
            model="Qwen1.5-14B",
            gpu="V100-SXM2-32G",
            tp=2,
            num_gpus=2,
            max_model_len=4096,
            gpu_memory_utilization=0.8,
        ),
        ("chat-3tier", None),
        dict(concurrency=400),
        40,
        True,
    ),
    "h200-7b-sessions-sync": (
        dict(model="Qwen2.5-7B", gpu="H200-SXM", tp=1, max_model_len=8192),
        ("enterprise-mix", None),
        dict(),
        20,
        False,
    ),
    "h200-7b-shared-gpu-no-caching": (
        dict(
            model="Qwen2.5-7B",
            gpu="H200-SXM",
            tp=1,
            num_gpus=1,
            max_model_len=8192,
            replicas_per_gpu=2,
            gpu_memory_utilization=0.45,
            enable_prefix_caching=False,
        ),
        ("enterprise-mix", SHARED_SYSTEM_PROMPT),
        dict(rate=60.0),
        20,
        True,
    ),
}

GOLDEN = {
    "seed-closed": "35e704804f3916e1e73d09c6e3fc1d2623ab9642bcc0dca33447c5426745a83f",
    "seed-open-enterprise-shared": "d287802437d181334d55b370284ef787641646d6371de7d0f039a923a17990a9",
    "overload-preempts": "9a727e2249c3ad0fe316a3542d8d7e56232094029f8a72fb3527b674511c0b97",
    "h200-7b-sessions-sync": "f9dfe94626bfdc06e5b8e70dfa8c37427025deecc916cffdbd0fcfe45f544b0a",
    "h200-7b-shared-gpu-no-caching": "6787e66ad315a5a48cd3e3d646106cb1d6312ac4b83d3ca741c6c3d19ddd0fb1",
}


def _log(log) -> dict:
    """The step log: when each step ran and its tokens were sent, and the peak KV usage
    (read the same from the versions that kept a column of usage per step)."""
    kept = {name: list(getattr(log, name)) for name in ("start", "end", "delivered")}
    peak = getattr(log, "peak_kv_usage", None)
    kept["peak_kv_usage"] = max(log.kv_usage, default=0.0) if peak is None else peak
    return kept


def run_digest(name: str) -> str:
    dep_kw, (workload, overrides), load, seconds, async_scheduling = SCENARIOS[name]
    dep_kw = dict(dep_kw)
    dep = resolve_deployment(load_model(dep_kw.pop("model")), get_gpu(dep_kw.pop("gpu")), **dep_kw)
    replicas = build_replicas(dep)
    if not async_scheduling:
        for r in replicas:
            r.config = dataclasses.replace(r.config, async_scheduling=False)
    source = build_source(load_workload(workload, overrides=overrides), seed=0, **load)
    res = ClusterSim(replicas, make_policy("least-outstanding"), source).run(seconds)
    data = {
        "records": [dataclasses.asdict(r) for r in res.records],
        "end_time": res.end_time,
        "replicas": [
            {
                "log": _log(r.log),
                "counters": dataclasses.asdict(r.engine.counters),
                "prefix_stats": dataclasses.asdict(r.engine.prefix_stats),
            }
            for r in res.replicas
        ],
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_simulation_results_are_unchanged(name):
    assert run_digest(name) == GOLDEN[name]


if __name__ == "__main__":
    for name in SCENARIOS:
        print(f'    "{name}": "{run_digest(name)}",')
