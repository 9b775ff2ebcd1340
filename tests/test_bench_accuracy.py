"""Acceptance: measured TTFT and ITL within 1 ms of the truth at P99, with 10 concurrent streams.

The server (a separate process) follows a fixed script — a role-only first chunk at once, the
first text 20 ms after the request arrived, chunks of 1-3 tokens 4 ms per token apart, a 30 ms
stall before every 8th chunk — and records when it wrote each chunk, on the same monotonic clock
(``GET /truth``). benchmarks/client_accuracy.py runs the same at 50 and 200 streams, and GuideLLM.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import numpy as np
import pytest

from servefleet.bench.point import Load, PointSettings
from servefleet.bench.runs import BenchConfig, run_bench
from servefleet.bench.schedule import StopRule
from servefleet.bench.selfcheck import runqueue_wait_ns
from servefleet.bench.testserver import spawn_test_server, truth_errors
from servefleet.workload import fixed_workload

ARGS = (
    "--ttft",
    "0.02",
    "--itl",
    "0.004",
    "--chunks",
    "1,3,1,2",
    "--stall-every",
    "8",
    "--stall",
    "0.03",
)


def measure() -> tuple[float, float, dict, list, float]:
    """One run of 300 requests at 10 streams: (TTFT P99 excess, ITL P99 excess, errors,
    records, the worst share of time the client or the server waited for a CPU)."""
    with spawn_test_server(*ARGS) as server:
        sched = f"/proc/{server.proc.pid}/schedstat"
        server_rq0, t0 = runqueue_wait_ns(sched), time.perf_counter()
        cfg = BenchConfig(
            server.url,
            fixed_workload(64, 24),
            PointSettings(StopRule(max_requests=300)),
            [Load(concurrency=10)],
            scrape=False,
        )
        try:
            import uvloop

            run = uvloop.run(run_bench(cfg))
        except ImportError:
            run = asyncio.run(run_bench(cfg))
        server_rq1, t1 = runqueue_wait_ns(sched), time.perf_counter()
        truth = json.loads(urllib.request.urlopen(server.url + "/truth", timeout=10).read())
    check = run.points[0].selfcheck
    waits = [check.runqueue_wait or 0.0]
    if server_rq0 is not None and server_rq1 is not None:
        waits.append((server_rq1 - server_rq0) / 1e9 / (t1 - t0))
    records = run.points[0].records
    e = truth_errors(records, truth)
    ttft_excess = np.percentile(e["ttft_meas"], 99) - np.percentile(e["ttft_true"], 99)
    itl_excess = np.percentile(e["itl_meas"], 99) - np.percentile(e["itl_true"], 99)
    print(
        f"P99 excess over the truth: TTFT {ttft_excess * 1e3:.3f} ms, ITL {itl_excess * 1e3:.3f} ms"
        f" (event-loop lag P99 {check.loop_lag_p99 * 1e3:.1f} ms; waited for a CPU: client "
        f"{waits[0]:.1%}, server {waits[-1]:.1%})"
    )
    return ttft_excess, itl_excess, e, records, max(waits)


NOISY = 0.03
"""A run in which the client or the server waited for a CPU more than 3 % of the time shared the
machine with other busy processes: its delays are theirs, not the client's."""


def test_ttft_and_itl_within_1ms_of_the_truth_at_p99_with_10_streams():
    for _ in range(3):
        ttft_excess, itl_excess, e, records, waited = measure()
        within = abs(ttft_excess) < 0.001 and abs(itl_excess) < 0.001
        if within or waited <= NOISY:
            break
    assert len(records) == 300 and all(r.ok for r in records)
    assert len(e["ttft_true"]) == 300 and len(e["itl_true"]) == 300 * 23
    assert e["ttft_meas"].min() > 0.015  # the role-only chunk (sent at once) is not the first token
    assert max(e["itl_true"]) > 0.02  # stalls happened, and multi-token chunks were split
    if not within and waited > NOISY:
        pytest.skip(
            f"the machine is oversubscribed by other processes (client or server waited for a "
            f"CPU {waited:.0%} of the time in 3 runs): accuracy not judged"
        )
    assert abs(ttft_excess) < 0.001
    assert abs(itl_excess) < 0.001
    # and request by request, the median error is far below a millisecond
    assert np.median(np.abs(e["ttft_err"])) < 0.001 and np.median(np.abs(e["itl_err"])) < 0.0005
