"""Quiet runs (``sim/cluster.py``) change how many events a run takes, never what it does:
with them and with one event per step (``max_quiet_run=0``), the same workload gives the same
records, step logs, engine counters and prefix-cache counters, to the last bit. The scenarios
cover what cuts a run or keeps one from starting: requests routed to a replica and reaching
its scheduler (with and without the API server's latency), sessions and shared prompts whose
blocks fill as events, preemption, a policy that reads pending prefills, a run stopped early,
replicas taking turns on a GPU."""

from __future__ import annotations

import dataclasses

import pytest

from servefleet.hardware import get_gpu
from servefleet.models import load_model
from servefleet.routing import make_policy
from servefleet.sim.cluster import ClusterSim, SimResult
from servefleet.sim.deployment import resolve_deployment
from servefleet.sim.frontend import Frontend
from servefleet.sim.runner import build_replicas
from servefleet.workload import build_source, fixed_workload, load_workload

SHARED_SYSTEM_PROMPT = {
    "classes": {
        "qa": {"system_prompt": {"tokens": 600, "share": 0.8, "groups": 3}},
        "summaries": {"system_prompt": {"tokens": 300, "share": 0.5, "groups": 2, "name": "doc"}},
    }
}


def _a100(n: int, **kw):
    return resolve_deployment(
        load_model("Llama-2-7B"), get_gpu("A100-80G-SXM"), tp=1, num_gpus=n, **kw
    )


def _seed(n: int = 8, **kw):
    return resolve_deployment(
        load_model("Qwen1.5-14B"),
        get_gpu("V100-SXM2-32G"),
        tp=2,
        num_gpus=n,
        max_model_len=4096,
        **kw,
    )


SCENARIOS = {
    # name: (deployment, workload, load, seconds, policy, run options)
    "poisson": (_a100(8), fixed_workload(1000, 300), dict(rate=36.0), 30, "least-outstanding", {}),
    "sessions-shared-prompts": (
        _seed(),
        load_workload("enterprise-mix", overrides=SHARED_SYSTEM_PROMPT),
        dict(rate=30.0),
        20,
        "least-outstanding",
        {},
    ),
    "closed-loop-preempts": (
        _seed(2, gpu_memory_utilization=0.8),
        load_workload("chat-3tier"),
        dict(concurrency=400),
        30,
        "least-outstanding",
        {},
    ),
    "predicted-latency": (
        _seed(),
        load_workload("chat-3tier"),
        dict(rate=25.0),
        20,
        "predicted-latency",
        {},
    ),
    "stopped-early": (
        _a100(4),
        fixed_workload(500, 200),
        dict(rate=60.0),
        60,
        "least-outstanding",
        dict(stop_waiting=100),
    ),
    "shared-gpu": (
        resolve_deployment(
            load_model("Qwen2.5-7B"),
            get_gpu("H200-SXM"),
            tp=1,
            max_model_len=8192,
            gpu_memory_utilization=0.45,
            replicas_per_gpu=2,
        ),
        fixed_workload(512, 128),
        dict(concurrency=8),
        20,
        "least-outstanding",
        {},
    ),
}


def _run(name: str, max_quiet_run: int, no_latency: bool = False) -> SimResult:
    dep, spec, load, seconds, policy, options = SCENARIOS[name]
    replicas = build_replicas(dep)
    if no_latency:  # admissions reach the scheduler as the API server finishes them
        for r in replicas:
            f = r.frontend
            r.frontend = Frontend(0.0, f.request_s, f.prompt_token_s, f.chunk_s)
    source = build_source(spec, seed=3, **load)
    sim = ClusterSim(replicas, make_policy(policy), source, max_quiet_run=max_quiet_run)
    return sim.run(seconds, **options)


def _everything(res: SimResult) -> tuple:
    logs = [{k: list(getattr(r.log, k)) for k in r.log.__slots__} for r in res.replicas]
    engines = [
        (
            dataclasses.astuple(r.engine.counters),
            dataclasses.astuple(r.engine.scheduler.kv.stats),
            r.engine.scheduler.step_index,
        )
        for r in res.replicas
    ]
    return res.records, logs, engines, res.end_time, res.stopped_at


@pytest.mark.parametrize(
    ("name", "no_latency"), [*((n, False) for n in SCENARIOS), ("poisson", True)]
)
def test_quiet_runs_give_the_same_results_as_an_event_per_step(name, no_latency):
    plain = _run(name, 0, no_latency)
    assert plain.records
    for limit in (3, 32):
        quiet = _run(name, limit, no_latency)
        assert _everything(quiet) == _everything(plain)
        if name == "shared-gpu":  # replicas taking turns on a GPU step one event at a time
            assert quiet.events == plain.events
        else:  # the runs happened
            assert quiet.events < plain.events, (quiet.events, plain.events)
    if name == "stopped-early":
        assert plain.stopped_at is not None and len(plain.records) > 100
    if name == "closed-loop-preempts":
        assert sum(r.preemptions or 0 for r in plain.records) > 0
