"""`servefleet bench` replaying production traces against a real sim-server: a Mooncake trace's
shared blocks reach the server's prefix cache as the trace says, an Azure trace is sent at its
recorded times."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

import pytest

from live_helpers import start_sim
from servefleet.records import read_jsonl
from servefleet.workload import block_reuse, load_workload

TRACES = Path(__file__).parent / "data" / "traces"
ENV = {**os.environ, "COLUMNS": "200"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with ExitStack() as stack:
        _, port = start_sim(
            tmp_path_factory.mktemp("sim"), "traces", stack, "--max-model-len", "16384"
        )
        yield f"http://127.0.0.1:{port}"


def bench(url: str, out: Path, *args: str) -> dict:
    argv = [sys.executable, "-m", "servefleet.cli", "bench", "--url", url, "--out", str(out),
            "--warmup", "0", "--gpu-metrics", "none", *args]  # fmt: skip
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=ENV)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return json.loads((out / "summary.json").read_text())


def test_mooncake_blocks_hit_the_servers_prefix_cache_as_the_trace_shares_them(server, tmp_path):
    trace = TRACES / "mooncake-sample.jsonl"
    s = bench(server, tmp_path / "m", "--workload", f"trace:{trace}", "--time-scale", "0.1",
              "--duration", "0", "--endpoint", "completions")  # fmt: skip
    (point,) = s["points"]
    assert point["records"] == 120
    analytic = block_reuse(load_workload(f"trace:{trace}").trace.records(), 512)
    assert point["server"]["prefix_hit_rate"] == pytest.approx(analytic, rel=0.01)
    recs = list(read_jsonl(next((tmp_path / "m").glob("records-*"))))
    assert all(r.ok and r.prompt_tokens == r.target_prompt_tokens for r in recs)  # exact lengths


def test_azure_trace_is_sent_at_its_recorded_times(server, tmp_path):
    trace = TRACES / "azure-sample.csv"
    spec = load_workload(
        f"trace:{trace}", overrides={"trace": {"max_requests": 25, "time_scale": 0.25}}
    )
    records = spec.trace.records()
    s = bench(server, tmp_path / "a", "--workload", f"trace:{trace}", "--max-requests", "25",
              "--time-scale", "0.25", "--duration", "0")  # fmt: skip
    (point,) = s["points"]
    assert point["records"] == 25
    recs = sorted(read_jsonl(next((tmp_path / "a").glob("records-*"))), key=lambda r: r.request_id)
    t0 = records[0].timestamp
    assert [r.scheduled_time for r in recs] == pytest.approx(
        [(rec.timestamp - t0) * 0.25 for rec in records], abs=1e-6
    )
    lags = sorted(r.send_time - r.scheduled_time for r in recs)
    assert lags[len(lags) // 2] < 0.05  # sent when the trace says, not merely in its order
    assert [r.target_prompt_tokens for r in recs] == [rec.prompt_tokens for rec in records]
