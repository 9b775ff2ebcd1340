"""The fleet that `servefleet up` ran on a real H200 (two vLLM 0.26 replicas sharing the GPU,
behind the gateway, measured with `servefleet bench`; docs/real-gpu.md) against `servefleet
simulate --fleet` of the same fleet.yaml, recomputed from the committed data: a change to the
engine model that breaks this agreement fails here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servefleet.hardware import get_gpu
from servefleet.models import load_model
from servefleet.plan.fleet_yaml import load_fleet
from servefleet.sim.deployment import resolve_deployment
from servefleet.sim.runner import simulate_point
from servefleet.workload import load_workload
from servefleet.workload.types import Load

DATA = Path(__file__).parent.parent / "benchmarks" / "real_gpu" / "data" / "h200-2x-shared"
VLLM_KV_TOKENS = (885_120, 886_272)  # "GPU KV cache size" of the two replicas' logs

# |sim / real - 1| limits per metric and concurrency: the measured errors (docs/real-gpu.md)
# plus a margin. TTFT under load is the largest gap (docs/validation.md: the API server).
LIMITS = {
    "output_throughput": {8: 0.06, 32: 0.06, 128: 0.10},
    "tpot.mean": {8: 0.06, 32: 0.07, 128: 0.12},
    "itl.p50": {8: 0.05, 32: 0.07, 128: 0.18},
    "ttft.p50": {8: 0.15, 32: 0.12, 128: 0.30},
}


@pytest.fixture(scope="module")
def fleet_and_bench():
    fleet = load_fleet(DATA / "fleet.yaml")
    bench = json.loads((DATA / "bench" / "summary.json").read_text())
    return fleet, bench


def _get(summary: dict, path: str) -> float:
    v = summary
    for k in path.split("."):
        v = v[k]
    return float(v)


def test_kv_capacity_of_replicas_sharing_the_gpu_matches_vllm(fleet_and_bench):
    fleet, _ = fleet_and_bench
    dep = resolve_deployment(
        load_model(fleet.model.name), get_gpu(fleet.gpus.type), **fleet.deployment_settings()
    )
    kv = dep.memory().kv_tokens
    for logged in VLLM_KV_TOKENS:
        assert abs(kv / logged - 1) < 0.005, (kv, logged)


def test_simulated_fleet_agrees_with_the_real_one(fleet_and_bench):
    fleet, bench = fleet_and_bench
    dep = resolve_deployment(
        load_model(fleet.model.name), get_gpu(fleet.gpus.type), **fleet.deployment_settings()
    )
    settings = bench["settings"]
    errors = {}
    for point in bench["points"]:
        c = point["load"]["concurrency"]
        sim = simulate_point(
            dep,
            load_workload(bench["workload"]["name"]),
            Load(concurrency=c),
            duration=settings["duration"],
            warmup=settings["warmup"],
            seed=settings["seed"],
            policy=fleet.gateway.policy,
        ).summary.to_dict()
        for metric, limit in LIMITS.items():
            err = _get(sim, metric) / _get(point["summary"], metric) - 1
            errors[metric, c] = err
            assert abs(err) <= limit[c], f"{metric} at c={c}: sim/real - 1 = {err:+.1%}"
    assert len(errors) == 12
