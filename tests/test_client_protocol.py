"""The client protocol as an input of the simulator: how the clients stream decides the API
server's work per chunk and per token, and the outputs say which protocol a prediction assumed."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from servefleet.client_protocol import SDK_CHAT, ClientProtocol, client_protocol, of_bench
from servefleet.hardware import get_gpu
from servefleet.models import load_model
from servefleet.report.run import client_protocol as described
from servefleet.sim.client_protocol import REFERENCE, STREAM_WORK, stream_work
from servefleet.sim.deployment import resolve_deployment
from servefleet.sim.frontend import Delivery, Frontend
from servefleet.sim.runner import build_replicas
from test_cli import run_cli


def test_names_and_refusals():
    assert client_protocol() == SDK_CHAT == ClientProtocol("chat", False)
    assert client_protocol("completions", "usage-per-chunk").name == "completions-usage-per-chunk"
    with pytest.raises(ValueError, match="--client-protocol"):
        client_protocol("chat", "continuous")
    with pytest.raises(ValueError, match="--endpoint"):
        client_protocol("responses", "sdk")


def test_a_bench_runs_protocol_is_read_as_the_report_names_it():
    """From the client record, else the settings; a run from before either was recorded
    streamed with per-chunk usage."""
    for meta in (
        {"client": {"endpoint": "completions", "continuous_usage": False}},
        {"target": {"endpoint": "chat"}, "settings": {"continuous_usage": False}},
        {"target": {"endpoint": "chat"}, "settings": {}},
    ):
        assert of_bench(meta).describe() == described(meta)
    assert of_bench({"settings": {}}) == ClientProtocol("chat", True)


def test_every_protocol_has_costs_with_a_source():
    for endpoint in ("chat", "completions"):
        for usage in (False, True):
            work = STREAM_WORK[ClientProtocol(endpoint, usage)]
            assert work.chunk_s > 0 and work.token_s >= 0 and work.source


def test_the_protocol_sets_the_api_servers_costs():
    """Every replica's API server takes the chunk and token costs of its deployment's
    protocol, scaled by the GPU host's (0 where the API server is not modelled)."""
    dep = resolve_deployment(load_model("Qwen2.5-7B"), get_gpu("H200-SXM"), replicas=2)
    eff = dep.gpu.efficiency
    for client in STREAM_WORK:
        for r in build_replicas(dep.with_(client=client)):
            assert r.client == client
            assert (r.frontend.chunk_s, r.frontend.token_s) == stream_work(eff, client)
    assert stream_work(eff, REFERENCE)[0] == eff.frontend_chunk_s
    assert stream_work(dataclasses.replace(eff, frontend_chunk_s=0.0), SDK_CHAT) == (0.0, 0.0)


def test_a_delivery_costs_its_tokens_too():
    """Two steps merged into one chunk per request: with a per-token cost the chunks take
    longer than one step's, without it the same."""

    def sent(token_s: float) -> float:
        fe = Frontend(chunk_s=100e-6, token_s=token_s)
        fe.stream(0.0, 0, 10, [])  # being sent
        fe.stream(0.0001, 1, 10, [])  # waits
        fe.stream(0.0002, 2, 10, [])  # merges into the waiting one
        _, delivered = fe.advance(1.0)
        assert [(d.first_step, d.last_step, d.tokens) for d in delivered] == [
            (0, 0, 10),
            (1, 2, 20),
        ]
        return delivered[1].time - delivered[0].time

    assert sent(0.0) == pytest.approx(10 * 100e-6)
    assert sent(50e-6) == pytest.approx(10 * (100e-6 + 2 * 50e-6))
    assert Delivery(0, 0, 3, []).tokens == 3


def test_simulate_records_the_protocol(tmp_path: Path):
    out = tmp_path / "run"
    p = run_cli(
        "simulate", "--model", "Qwen2.5-7B", "--gpu", "H200-SXM", "--num-gpus", "1", "--tp", "1",
        "--concurrency", "4", "--duration", "10", "--warmup", "1", "--records", "none",
        "--endpoint", "completions", "--client-protocol", "usage-per-chunk", "--out", str(out),
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "clients stream completions, usage on every chunk" in " ".join(p.stdout.split())
    meta = json.loads((out / "summary.json").read_text())
    assert meta["client"] == {"endpoint": "completions", "continuous_usage": True}
    assert meta["deployment"]["client_protocol"] == "completions-usage-per-chunk"
    assert described(meta) == "completions, usage on every chunk"
    bad = run_cli("simulate", "--client-protocol", "always")
    assert bad.returncode == 2 and "sdk or usage-per-chunk" in bad.stderr
