"""The fast path (``servefleet.fastpath``: lazy decodes, blocks cached late, and quiet runs,
``sim.cluster.QuietRun``: a replica's steps in which nothing happens but decodes run as one
event, not one a step) against the plain rule (``engine.Engine``, ``ClusterSim(fast=False)``,
an event a step): the same records, step logs, engine counters and KV statistics."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servefleet.engine.cost_model import CostModel
from servefleet.hardware import get_gpu
from servefleet.models import load_model
from servefleet.routing import make_policy
from servefleet.sim.cluster import ClusterSim
from servefleet.sim.deployment import resolve_deployment
from servefleet.sim.runner import build_replicas
from servefleet.workload import build_source, fixed_workload, load_workload


def _run(fast: bool, model, gpu, tp, num_gpus, workload, policy, load, stop_waiting=None, **kw):
    dep = resolve_deployment(load_model(model), get_gpu(gpu), tp=tp, num_gpus=num_gpus, **kw)
    replicas = build_replicas(dep)
    records: list = []
    source = build_source(workload, seed=1, **load)
    sim = ClusterSim(replicas, make_policy(policy), source, dep.answers, records.append, fast=fast)
    result = sim.run(30.0, stop_waiting=stop_waiting)
    return result.events, {
        "records": [r.to_dict() for r in records],
        "logs": [(r.log.start, r.log.end, r.log.delivered, r.log.peak_kv_usage) for r in replicas],
        "counters": [dataclasses.astuple(r.engine.counters) for r in replicas],
        "kv": [dataclasses.astuple(r.engine.prefix_stats) for r in replicas],
        "end": result.end_time,
        "stopped": result.stopped_at,
    }


SCENARIOS = {
    # preemptions, rejections, sessions (resent answers: prefix caching), several classes
    "overloaded-v100": dict(
        model="Qwen1.5-14B",
        gpu="V100-SXM2-32G",
        tp=2,
        num_gpus=4,
        workload=load_workload("enterprise-mix"),
        policy="least-outstanding",
        load={"rate": 40.0},
        max_model_len=2048,
        gpu_memory_utilization=0.6,
    ),
    # the scaling scenario of benchmarks/sim_speed.py: long runs of quiet steps
    "steady-decodes": dict(
        model="Llama-2-7B",
        gpu="A100-80G-SXM",
        tp=1,
        num_gpus=8,
        workload=fixed_workload(1000, 300),
        policy="least-outstanding",
        load={"rate": 36.0},
        max_model_len=4096,
    ),
    # a closed loop: each request sent as one finishes
    "closed-loop": dict(
        model="Qwen2.5-7B",
        gpu="H200-SXM",
        tp=1,
        num_gpus=2,
        workload=fixed_workload(600, 40),
        policy="round-robin",
        load={"concurrency": 16},
    ),
    # given up early (stop_waiting) while runs are in flight: they are caught up to the stop
    "stopped": dict(
        model="Llama-2-7B",
        gpu="A100-80G-SXM",
        tp=1,
        num_gpus=4,
        workload=fixed_workload(1000, 300),
        policy="least-outstanding",
        load={"rate": 22.0},
        stop_waiting=12,
        max_model_len=4096,
    ),
    # a policy told of first tokens, sessions on a prefix cache
    "predicted-latency": dict(
        model="Qwen2.5-7B",
        gpu="H200-SXM",
        tp=1,
        num_gpus=4,
        workload=load_workload("enterprise-mix"),
        policy="predicted-latency",
        load={"rate": 30.0},
    ),
}


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_fast_path_changes_nothing_but_the_work(name: str):
    quiet_events, quiet = _run(True, **SCENARIOS[name])
    plain_events, plain = _run(False, **SCENARIOS[name])
    for key in plain:
        assert quiet[key] == plain[key], key
    assert quiet["records"] and quiet_events < plain_events
    assert (quiet["stopped"] is not None) == ("stop_waiting" in SCENARIOS[name])


def test_quiet_runs_save_many_events_in_steady_decodes():
    quiet_events, run = _run(True, **SCENARIOS["steady-decodes"])
    plain_events, _ = _run(False, **SCENARIOS["steady-decodes"])
    steps = sum(len(log[0]) for log in run["logs"])
    # with an event a step, more events than steps (arrivals, API-server tasks too); quiet
    # runs save more than one event for every three steps (at 16 replicas, 60 s: 35,597
    # against 54,364 events for 35,996 steps)
    assert plain_events > steps
    assert plain_events - quiet_events > steps / 3


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 512),
    contexts=st.lists(st.integers(0, 4_000_000), min_size=1, max_size=8),
    tp=st.sampled_from([1, 2, 4]),
    overlap=st.booleans(),
    gpu=st.sampled_from(["V100-SXM2-32G", "A100-80G-SXM", "H200-SXM"]),
)
def test_decode_step_times_are_step_time_bit_for_bit(n, contexts, tp, overlap, gpu):
    cost = CostModel(load_model("Qwen2.5-7B"), get_gpu(gpu), tp=tp, overlap_host=overlap)
    want = [cost.step_time(n, n, n, c, [], n) for c in contexts]
    assert cost.decode_step_times(n, contexts) == want
