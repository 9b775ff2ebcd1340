"""Re-prefill under preemption, as `servefleet bench` derives it from vLLM's counters: a number
where they determine it (0 without preemption), else "n/a" with an upper bound — checked
against a sim-server whose own ``servefleet:sim_recomputed_tokens`` knows the truth, and against
the committed H200 data (vLLM 0.26, whose ``prompt_tokens`` equal the client's under
preemption)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from servefleet.bench.scrape import parse_metrics, reprefill_bounds
from servefleet.bench.testserver import Spawned
from servefleet.report.run import load_run
from servefleet.report.tables import server_table

REPO = Path(__file__).resolve().parents[1]
H200 = REPO / "benchmarks/real_gpu/data/h200-baselines"
ENV = {**os.environ, "COLUMNS": "220"}
TRUTH = ("servefleet:sim_recomputed_tokens_total", "")


def test_bounds_rule():
    assert reprefill_bounds(0, 1000, 0, 600) == (0.0, 0.0)  # nothing preempted: exactly 0
    assert reprefill_bounds(None, 1000, 0, 600) == (None, None)  # no counter: unknown
    ratio, most = reprefill_bounds(2, 1000, 200, 600)  # 800 computed, at most 2 x 600 again
    assert ratio is None and most == pytest.approx(1200 / 2000)


def scrape(url: str) -> dict:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        return parse_metrics(r.read().decode())


def test_a_preempting_sim_server_gets_na_with_a_bound_that_holds_the_truth(tmp_path: Path):
    argv = [sys.executable, "-m", "servefleet.sim.server", "--model", "Qwen2.5-7B", "--gpu",
            "H200-SXM", "--gpu-memory-utilization", "0.125", "--max-model-len", "4096",
            "--startup-time", "0", "--time-scale", "20", "--port", "0"]  # fmt: skip
    out = tmp_path / "run"
    with Spawned(argv) as server:
        before = scrape(server.url)
        p = subprocess.run(
            [sys.executable, "-m", "servefleet.bench", "bench", "--url", server.url,
             "--endpoint", "completions", "--input-len", "512", "--output-len", "512",
             "--concurrency", "64", "--duration", "2", "--warmup", "0.5", "--no-progress",
             "--out", str(out)],
            capture_output=True, text=True, timeout=120, env=ENV,
        )  # fmt: skip
        after = scrape(server.url)
    assert p.returncode == 0, p.stderr
    point = json.loads((out / "summary.json").read_text())["points"][0]
    srv = point["server"]
    busy = point["telemetry"]  # no GPU here: the sim-server's modelled busy share instead
    assert busy["kind"] == "modelled" and len(busy["t"]) >= 2
    assert all(0 < f["utilization_mean"] <= 100 for f in busy["figures"].values())
    assert srv["preemptions"] > 0 and srv["reprefill"] is None  # never a 0 it cannot know
    recomputed = after[TRUTH] - before.get(TRUTH, 0.0)
    truth = recomputed / (srv["prompt_tokens"] - (srv["prompt_cached"] or 0) + recomputed)
    assert 0 < truth <= srv["reprefill_max"] < 1
    assert f"n/a (≤ {srv['reprefill_max']:.1%})" in p.stdout


def test_vllm_on_the_h200_counts_no_recomputation_and_the_report_says_na():
    run = load_run(H200 / "bench-vllm")
    by_label = {p.label: p.raw["server"] for p in run.points}
    assert by_label["c=8"]["preemptions"] == 0 and by_label["c=8"]["reprefill"] == 0.0
    c64 = by_label["c=64"]
    assert c64["preemptions"] == 34 and c64["reprefill"] is None
    assert c64["prompt_tokens"] == c64["client_prompt_tokens"] == 89547  # no recomputed token
    assert c64["reprefill_max"] == pytest.approx(34 * 674 / (89547 + 34 * 674))
    rows = {r[0]: r[-1] for r in server_table(run).rows}
    assert rows == {"c=1": "0.0%", "c=8": "0.0%", "c=64": "n/a (≤ 20.4%)"}


def test_the_sim_server_exposes_vllm_026s_names_and_types_and_no_other():
    import tarfile

    from prometheus_client.parser import text_string_to_metric_families

    from servefleet.hardware import get_gpu
    from servefleet.models import load_model
    from servefleet.sim.deployment import resolve_deployment
    from servefleet.sim.server.metrics import ServerMetrics

    with tarfile.open(H200 / "logs.tar.gz") as t:
        real_text = t.extractfile("vllm-metrics-after.txt").read().decode()
    real = {f.name: f.type for f in text_string_to_metric_families(real_text)}
    dep = resolve_deployment(load_model("Qwen2.5-7B"), get_gpu("H200-SXM"))
    m = ServerMetrics("m", 4096, dep.build_engine(), {"block_size": "16"}, {"gpu": "x"}, lambda: 0)
    ours = {
        f.name: f.type
        for f in text_string_to_metric_families(m.render().decode())
        if f.name.startswith("vllm:")
    }
    assert set(ours) <= set(real), set(ours) - set(real)  # no name vLLM 0.26 lacks
    assert {k: real[k] for k in ours} == ours
    for name in ("vllm:num_preemptions", "vllm:prompt_tokens", "vllm:prompt_tokens_cached",
                 "vllm:prefix_cache_queries", "vllm:request_prefill_kv_computed_tokens"):  # fmt: skip
        assert name in ours
