"""The prefix-hit rate a measured point reports (servefleet/prefix_hit.py): prompt tokens served
from the cache ÷ prompt tokens, each request once — from the requests' ``cached_tokens``, else
vLLM's ``prompt_tokens_cached ÷ prompt_tokens``, else its lookup counters with a note. Checked
on a real sim-server that queues (whose lookup counters, like vLLM 0.26's, count every retry of
a blocked queue head) and on the committed H200 run (vLLM 0.26, enterprise-mix)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from servefleet.bench.scrape import parse_metrics
from servefleet.bench.testserver import Spawned
from servefleet.prefix_hit import REQUESTS, SERVER_LOOKUPS, SERVER_PROMPT_TOKENS, prefix_hit
from servefleet.records import RequestRecord
from servefleet.report.run import load_run
from servefleet.report.tables import sweep_table

REPO = Path(__file__).resolve().parents[1]
MIX = REPO / "benchmarks/real_vllm/data/h200-q14-mix/bench"
ENV = {**os.environ, "COLUMNS": "240"}


def _rec(prompt: int, cached: int | None, status: str = "ok") -> RequestRecord:
    return RequestRecord(
        request_id="x",
        class_name="qa",
        scheduled_time=0.0,
        send_time=0.0,
        prompt_tokens=prompt,
        cached_tokens=cached,
        status=status,
        end_time=1.0,
    )


def test_sources_in_order():
    srv = {"prompt_tokens": 1000, "prompt_cached": 300, "prefix_queries": 4000, "prefix_hits": 300}
    recs = [_rec(600, 200), _rec(400, 0), _rec(500, None), _rec(900, 900, "error")]
    hit = prefix_hit(recs, srv)
    assert (hit.rate, hit.source, hit.note) == (pytest.approx(0.2), REQUESTS, None)
    hit = prefix_hit([_rec(500, None)], srv)
    assert (hit.rate, hit.source, hit.note) == (pytest.approx(0.3), SERVER_PROMPT_TOKENS, None)
    lookups = {"prefix_queries": 4000, "prefix_hits": 300, "peak_waiting": 12}
    hit = prefix_hit([], lookups)
    assert (hit.rate, hit.source) == (pytest.approx(0.075), SERVER_LOOKUPS)
    assert "every scheduling attempt" in hit.note and "12 waiting" in hit.note
    assert prefix_hit([], None).source is None and prefix_hit([], {}).rate is None


def _scrape(url: str) -> dict:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        return parse_metrics(r.read().decode())


def test_a_queueing_sim_server_reports_the_rate_of_the_requests(tmp_path: Path):
    wl = tmp_path / "shared.yaml"
    wl.write_text(
        "arrival: {type: poisson, rate: 10}\nclasses:\n  qa:\n    prompt: 600\n    output: 64\n"
        "    system_prompt: {tokens: 512, share: 1.0, groups: 2}\n"
    )
    argv = [sys.executable, "-m", "servefleet.sim.server", "--model", "Qwen2.5-7B", "--gpu",
            "H200-SXM", "--gpu-memory-utilization", "0.125", "--max-model-len", "4096",
            "--startup-time", "0", "--time-scale", "20", "--port", "0",
            "--enable-prompt-tokens-details"]  # fmt: skip
    out = tmp_path / "run"
    with Spawned(argv) as server:
        before = _scrape(server.url)
        p = subprocess.run(
            [sys.executable, "-m", "servefleet.bench", "bench", "--url", server.url,
             "--workload", str(wl), "--concurrency", "96", "--duration", "2", "--warmup",
             "0.5", "--no-progress", "--out", str(out)],
            capture_output=True, text=True, timeout=120, env=ENV,
        )  # fmt: skip
        after = _scrape(server.url)
    assert p.returncode == 0, p.stderr
    point = json.loads((out / "summary.json").read_text())["points"][0]
    srv, hit = point["server"], point["prefix_hit"]
    with gzip.open(out / point["records_file"], "rt") as f:
        recs = [json.loads(line) for line in f]
    ok = [r for r in recs if r["status"] == "ok"]
    assert ok and all(r["cached_tokens"] is not None for r in ok)
    per_request = sum(r["cached_tokens"] for r in ok) / sum(r["prompt_tokens"] for r in ok)
    assert hit["source"] == REQUESTS and hit["rate"] == pytest.approx(per_request)
    assert 0.3 < per_request < 1  # the shared system prompt is served from the cache
    # vLLM's per-request counters say the same, over the same requests
    assert srv["prompt_cached"] / srv["prompt_tokens"] == pytest.approx(per_request)
    # the lookup counters count each retry of a blocked queue head (the server queued)
    assert srv["peak_waiting"] > 0
    q = ("vllm:prefix_cache_queries_total", "")
    assert after[q] - before[q] == srv["prefix_queries"] > srv["prompt_tokens"]
    assert srv["prefix_hits"] > srv["prompt_cached"]  # a blocked head's hits, at each retry
    # the reports show the requests' rate as "prefix hit"
    show = subprocess.run(
        [sys.executable, "-m", "servefleet", "report", "show", str(out)],
        capture_output=True, text=True, timeout=60, env=ENV,
    )  # fmt: skip
    assert show.returncode == 0, show.stderr
    assert f"{per_request:.1%}" in show.stdout


def test_the_h200_run_reports_the_requests_rate_not_vllms_lookup_rate():
    run = load_run(MIX / "rate3")
    (point,) = run.points
    srv = point.raw["server"]
    hit = prefix_hit(point.records, srv)
    assert hit.source == REQUESTS and hit.rate == pytest.approx(13184 / 324887)
    assert srv["prefix_hits"] / srv["prefix_queries"] == pytest.approx(13184 / 915620)
    table = sweep_table(run)
    col = table.head.index("prefix hit")
    assert table.rows[0][col] == "4.1%"
