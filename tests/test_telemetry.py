"""GPU telemetry: the DCGM-named endpoint (prometheus_client's real HTTP server, which gzips for
clients that accept it), the bench sampling it per point, the modelled busy share of the
sim-server and the simulator, and the one-line answer where NVML is missing."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from servefleet.bench.gpu import GpuSampler
from servefleet.bench.testserver import spawn_test_server
from servefleet.report.html import render_html
from servefleet.report.run import load_run
from servefleet.telemetry.busy import busy_fraction
from servefleet.telemetry.exporter import GpuCollector, serve_collector
from servefleet.telemetry.nvml import GpuReading, open_nvml
from servefleet.telemetry.series import busy_series, parse_gpu_metrics

ENV = {**os.environ, "COLUMNS": "200"}
H200 = [
    GpuReading(0, "GPU-aaa", "NVIDIA H200", 87.0, 40 * 2**30, 141 * 2**30, 352.5, 1980.0),
    GpuReading(1, "GPU-bbb", "NVIDIA H200", 3.0, 2**30, 141 * 2**30, 80.0, 345.0),
]


@pytest.fixture
def dcgm():
    server = serve_collector(GpuCollector(lambda: H200, {0: "replica-0,replica-1"}), 0)
    yield server.url
    server.close()


def test_the_endpoint_speaks_dcgm_and_the_bench_reads_it_even_gzipped(dcgm):
    async def main():
        # the bench's own session settings: no automatic decompression
        async with aiohttp.ClientSession(auto_decompress=False) as session:
            s = GpuSampler(dcgm, session, interval=0.05)
            assert await s.probe() is None
            s.start(time.perf_counter())

            async def three_samples() -> None:
                while s.series is None or len(s.series.t) < 3:
                    await asyncio.sleep(0.02)

            await asyncio.wait_for(three_samples(), 10)
            return await s.stop()

    series = asyncio.run(main())
    figs = series.figures()
    assert set(figs) == {"GPU-aaa", "GPU-bbb"}
    assert figs["GPU-aaa"]["utilization_mean"] == 87.0 and figs["GPU-aaa"]["power_max"] == 352.5
    assert figs["GPU-aaa"]["memory_used_max"] == pytest.approx(40 * 1024)  # MiB, as DCGM
    assert series.gpus["GPU-aaa"]["replica"] == "replica-0,replica-1"


def test_bench_records_gpu_telemetry_per_point_and_the_html_plots_it(dcgm, tmp_path: Path):
    out = tmp_path / "run"
    with spawn_test_server("--ttft", "0.005", "--itl", "0.002") as s:
        p = subprocess.run(
            [sys.executable, "-m", "servefleet.bench", "bench", "--url", s.url,
             "--input-len", "16", "--output-len", "8", "--concurrency", "1,2", "--duration",
             "1.5", "--warmup", "0.2", "--gpu-metrics", dcgm, "--no-progress", "--out", str(out)],
            capture_output=True, text=True, timeout=90, env=ENV,
        )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert f"GPU telemetry from {dcgm}" in p.stderr
    summary = json.loads((out / "summary.json").read_text())
    for pt in summary["points"]:
        tel = pt["telemetry"]
        assert tel["kind"] == "measured" and len(tel["t"]) >= 2
        assert tel["values"]["utilization"]["GPU-aaa"][0] == 87.0
    html = render_html(load_run(out))
    for plot in ("gpu-utilization", "gpu-memory_used", "gpu-power"):
        assert f'data-plot="{plot}"' in html
    assert "GPUs during each point" in html and "87 %" in html


def test_without_nvml_it_says_so_in_one_line():
    got = open_nvml()
    if not isinstance(got, str):
        got.close()
        pytest.skip("NVML works here")
    assert got.startswith("GPU telemetry off:") and "\n" not in got
    p = subprocess.run(
        [sys.executable, "-m", "servefleet.telemetry", "--port", "0"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert p.returncode == 1 and p.stderr.strip() == got


def test_modelled_busy_share():
    # steps [0, 0.5) and [1.5, 2.0): half of the first second, half of the second
    t, f = busy_fraction([0.0, 1.5], [0.5, 2.0], 0.0, 2.0, bins=2)
    assert t == [0.5, 1.5] and f == pytest.approx([0.5, 0.5])
    s = busy_series("x", [0.0, 1.0, 2.0], [{"r0": 0.0}, {"r0": 0.25}, {"r0": 1.25}])
    assert s.kind == "modelled" and s.values["utilization"]["r0"] == pytest.approx([25.0, 100.0])


def test_parse_keeps_each_gpu_apart():
    text = "\n".join(
        [
            "# TYPE DCGM_FI_DEV_GPU_UTIL gauge",
            'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",modelName="H200"} 50',
            'DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-b",modelName="H200"} 70',
            "# TYPE DCGM_FI_DEV_POWER_USAGE gauge",
            'DCGM_FI_DEV_POWER_USAGE{gpu="1",UUID="GPU-b",modelName="H200"} 300.5',
            "",
        ]
    )
    g = parse_gpu_metrics(text)
    assert g["GPU-a"]["readings"] == {"utilization": 50.0}
    assert g["GPU-b"]["readings"] == {"utilization": 70.0, "power": 300.5}
