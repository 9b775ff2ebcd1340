"""A planned fleet serves its whole workload: `servefleet up` of the plan's fleet.yaml (sim-server
replicas, the real gateway, real processes over loopback) and `servefleet bench` with the
workload it was planned for — no request is refused (HTTP 400) for its length.

The plans here are quick (screening only): the flags that can refuse a request —
max-model-len, and the KV cache holding one whole sequence — are the same as the full plan's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from servefleet.fleet.commands import free_ports
from servefleet.plan.fleet_yaml import dump_fleet
from servefleet.plan.planner import PlanRequest, make_plan
from servefleet.plan.search import SearchSettings, SLOTarget
from servefleet.records import read_jsonl
from test_fleet import Up, kill_up, spawn_up

QUICK = SearchSettings(window=20.0, warmup=5.0, sustain=False)
OLD_LIMIT = 3072
"""The max-model-len a planner sizing by the synthetic mix's P99 would choose."""


def quick_plan(workload: str, classes: frozenset[str] | None):
    req = PlanRequest(
        workload=workload,
        slo=SLOTarget(classes=classes),
        engine="sim",
        settings=QUICK,
        variants=False,
        band=False,
        jobs=1,
    )
    return make_plan(req)


def on_free_ports(fleet):
    ports = free_ports(len(fleet.replicas) + 1)
    reps = [r.model_copy(update={"port": p}) for r, p in zip(fleet.replicas, ports, strict=False)]
    gw = fleet.gateway.model_copy(update={"host": "127.0.0.1", "port": ports[-1]})
    return fleet.model_copy(update={"replicas": reps, "gateway": gw})


@pytest.mark.parametrize(
    ("workload", "classes", "rate"),
    [("chat-3tier", None, 2.0), ("enterprise-mix", frozenset({"qa", "sessions"}), 1.0)],
)
def test_benching_the_planned_fleet_refuses_no_request(tmp_path: Path, workload, classes, rate):
    plan = quick_plan(workload, classes)
    assert plan.flags.max_model_len >= 4096 and plan.flags.gpu_memory_utilization <= 0.90
    fleet = on_free_ports(plan.fleet)
    (tmp_path / "fleet.yaml").write_text(dump_fleet(fleet))
    state = tmp_path / "state"
    up = spawn_up(tmp_path / "fleet.yaml", state, "--time-scale", "20")
    try:
        Up(up, state).expect("fleet up:")
        out = tmp_path / "bench"
        bench = subprocess.run(
            [
                *(sys.executable, "-m", "servefleet.cli", "bench"),
                *("--url", f"http://127.0.0.1:{fleet.gateway.port}", "--model", fleet.model.name),
                *("--workload", workload, "--rate", str(rate), "--duration", "8"),
                *("--warmup", "0", "--no-progress", "--no-whole-burst-periods"),
                *("--out", str(out)),
            ],
            capture_output=True,
            text=True,
            timeout=240,
            env={**os.environ, "COLUMNS": "200"},
        )
        assert bench.returncode in (0, 1), bench.stderr[-2000:]
        records = [r for f in sorted(out.glob("records-*.jsonl.gz")) for r in read_jsonl(f)]
    finally:
        kill_up(up, state)
    assert records, bench.stdout[-2000:]
    refused = [r for r in records if r.error and "400" in r.error]
    assert not refused, refused[0].error
    longest = max(r.target_prompt_tokens + r.target_output_tokens for r in records)
    if workload == "enterprise-mix":  # the summaries' burst at t=0: the old limit refused some
        assert longest > OLD_LIMIT
