"""Every request counts: failures in the warm-up and cool-down, a replica that rejects every
prompt, --max-error-rate and the exit status, and a run killed mid-way (marked incomplete)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from servefleet.bench.testserver import Spawned, spawn_test_server
from servefleet.records import RequestRecord, read_jsonl
from servefleet.report.html import render_html
from servefleet.report.run import load_run
from servefleet.stats import CANCELLED, SLO, Window, summarize
from test_bench_units import rec

ENV = {**os.environ, "COLUMNS": "220", "PYTHONUNBUFFERED": "1"}


def bench(*args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "servefleet.bench", "bench", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
    )


def report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "servefleet.bench", "report", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=ENV,
    )


def test_counts_cover_the_whole_point_and_latencies_only_the_window():
    def ok(rid: str, send: float) -> RequestRecord:
        return rec(rid, send, send)

    def bad(rid: str, send: float, error: str = "HTTP 400: too long") -> RequestRecord:
        status = "aborted" if error.startswith("aborted") else "error"
        return RequestRecord(rid, "qa", send, send, end_time=send, status=status, error=error)

    recs = [
        bad("w1", 0.1),  # in the warm-up
        bad("w2", 0.5),
        ok("a", 2.0),
        ok("b", 3.0),
        bad("c", 3.5, "timeout: no complete response within 1 s"),
        bad("cool", 9.5),  # in the cool-down
        bad("x", 9.6, CANCELLED),  # Ctrl-C: the client's doing, apart
    ]
    s = summarize(recs, Window(1.0, 9.0), SLO())
    assert (s.num_requests, s.num_ok, s.num_failed, s.num_cancelled) == (7, 2, 4, 1)
    assert s.error_kinds == {"HTTP 400": 3, "timeout": 1}
    assert s.window_requests == 3 and s.ttft.count == 2  # latencies: sent inside the window
    assert s.error_rate == pytest.approx(4 / 6)
    assert s.failed_point(0.01) and not s.failed_point(0.7)


@pytest.fixture(scope="module")
def rejecting_replica():
    """A sim-server whose max-model-len (32) is below every prompt: vLLM's HTTP 400 for each."""
    argv = [sys.executable, "-m", "servefleet.sim.server", "--model", "Qwen2.5-7B", "--gpu",
            "H200-SXM", "--max-model-len", "32", "--startup-time", "0", "--port", "0"]  # fmt: skip
    with Spawned(argv) as server:
        yield server.url


def test_a_replica_that_rejects_every_prompt_fails_every_request_warmup_included(
    rejecting_replica, tmp_path: Path
):
    out = tmp_path / "run"
    p = bench(
        "--url", rejecting_replica, "--endpoint", "completions", "--input-len", "64",
        "--output-len", "8", "--rate", "20", "--duration", "4", "--warmup", "2",
        "--no-progress", "--out", str(out),
    )  # fmt: skip
    assert p.returncode == 1, p.stderr
    recs = list(read_jsonl(out / "records-r20.jsonl.gz"))
    n = len(recs)
    assert n > 50 and not any(r.ok for r in recs)
    assert sum(r.send_time < 2.0 for r in recs) > 20  # many failed inside the warm-up
    summary = json.loads((out / "summary.json").read_text())
    pt = summary["points"][0]
    s = pt["summary"]
    assert (s["num_requests"], s["num_ok"], s["num_failed"]) == (n, 0, n)
    assert s["error_kinds"] == {"HTTP 400": n} and pt["failed"] is True
    assert summary["complete"] is True
    assert f"FAILED point 20 req/s: {n} of {n} requests failed" in p.stderr
    assert f"0/{n}" in p.stdout and "FAILED" in p.stdout  # the terminal table
    assert re.search(rf"HTTP 400\W+{n}\W", p.stdout)  # the errors table: every one counted
    html = render_html(load_run(out))
    assert 'class="failed"' in html and f"0/{n}" in html and "FAILED" in html


def test_max_error_rate_decides_whether_a_point_failed(tmp_path: Path):
    with spawn_test_server("--fail-every", "4", "--ttft", "0.002", "--itl", "0.001") as s:
        args = ["--url", s.url, "--input-len", "8", "--output-len", "4", "--concurrency", "2",
                "--requests", "40", "--duration", "0", "--no-progress"]  # fmt: skip
        strict = bench(*args, "--out", str(tmp_path / "strict"))
        lax = bench(*args, "--max-error-rate", "0.3", "--out", str(tmp_path / "lax"))
    assert strict.returncode == 1 and "FAILED point c=2: 10 of 40" in strict.stderr
    assert lax.returncode == 0, lax.stderr
    assert (
        json.loads((tmp_path / "lax" / "summary.json").read_text())["points"][0]["failed"] is False
    )


def test_a_run_killed_mid_way_is_marked_incomplete(tmp_path: Path):
    out = tmp_path / "run"
    with spawn_test_server("--ttft", "0.002", "--itl", "0.001") as s:
        proc = subprocess.Popen(
            [sys.executable, "-m", "servefleet.bench", "bench", "--url", s.url,
             "--input-len", "8", "--output-len", "4", "--concurrency", "1,2,4",
             "--duration", "1", "--warmup", "0", "--no-progress", "--out", str(out)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
        )  # fmt: skip
        for line in proc.stderr:  # printed once the point's files are written
            if line.startswith("point 1: c=1 done"):
                break
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] is False and summary["points_planned"] == 3
    assert 1 <= len(summary["points"]) < 3
    shown = report("show", str(out))
    assert shown.returncode == 0 and "INCOMPLETE" in shown.stdout
    assert "INCOMPLETE" in render_html(load_run(out))
