"""servefleet demo, shortened (a small plan search, one load point each): it runs end to end
with real sim-server and gateway processes, writes the report, and leaves no process behind —
also when interrupted once its fleet is up."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from servefleet.fleet.demo import local_fleet
from servefleet.fleet.state import pid_alive, read_state
from servefleet.plan.fleet_yaml import Fleet, load_fleet

TINY = """
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, even if the
# tests run where SIGINT is ignored (a background job of a non-interactive shell, inherited)
from pathlib import Path
from rich.console import Console
from servefleet.fleet.demo import DemoSettings, run_demo
s = DemoSettings(sim_concurrency=(2,), sim_duration=30.0, sim_warmup=5.0,
                 bench_concurrency=(2,), bench_duration={bench}, time_scale=10.0,
                 startup_time=0.2, plan_window=10.0, plan_rel_tol=0.5)
try:
    print("report:", run_demo(Path(sys.argv[1]), s, Console(), Console(stderr=True)), flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(130)
"""


def _run(out: Path, bench: float) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", TINY.format(bench=bench), str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "COLUMNS": "300"},
    )


def _cleanup(proc: subprocess.Popen, out: Path) -> list[int]:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    pids = [p["pid"] for p in (read_state(out / "fleet") or {}).get("processes", [])]
    for pid in pids:
        if pid_alive(pid):
            os.killpg(pid, signal.SIGKILL)
    return pids


def test_demo_end_to_end_writes_the_report_and_stops_everything(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    proc = _run(out, bench=3.0)
    replicas = -1
    try:
        text, _ = proc.communicate(timeout=150)
        assert proc.returncode == 0, text
        replicas = len(load_fleet(out / "fleet.yaml").replicas)  # the plan's split
        assert f"fleet up: {replicas} sim-servers" in text
        html = (out / "report.html").read_text()
        assert "predicted (simulate)" in html and "time scale undone" in html
        assert "--time-scale 10" in html
        measured = json.loads((out / "measured" / "summary.json").read_text())
        assert measured["points"][0]["summary"]["num_ok"] > 0
        assert (out / "predicted" / "summary.json").is_file() and (out / "fleet.yaml").is_file()
    finally:
        pids = _cleanup(proc, out)
    assert len(pids) == replicas + 1 and not any(pid_alive(p) for p in pids)


def test_demo_interrupted_once_up_stops_every_process(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    proc = _run(out, bench=120.0)
    try:
        seen = []
        for line in proc.stdout:  # the signal: the line printed once the fleet is up
            seen.append(line)
            if line.startswith("fleet up:"):
                break
        else:
            raise AssertionError("".join(seen))
        os.kill(proc.pid, signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
        assert proc.returncode == 130, "".join(seen) + rest
        assert "interrupted" in rest
    finally:
        pids = _cleanup(proc, out)
    replicas = len(load_fleet(out / "fleet.yaml").replicas)
    assert len(pids) == replicas + 1 and not any(pid_alive(p) for p in pids)


def test_local_fleet_moves_the_plan_to_loopback_ports() -> None:
    fleet = Fleet.model_validate(
        {
            "model": {"name": "Qwen1.5-14B", "path": "Qwen/Qwen1.5-14B-Chat"},
            "gpus": {"type": "V100-SXM2-32G", "count": 4},
            "vllm": {"max_model_len": 4096, "max_num_seqs": 32, "max_num_batched_tokens": 512},
            "replicas": [
                {"name": "replica-0", "tp": 2, "gpu_ids": [0, 1], "port": 8001},
                {"name": "replica-1", "tp": 2, "gpu_ids": [2, 3], "port": 8002},
            ],
        }
    )
    f = local_fleet(fleet, [5001, 5002, 5000])
    assert f.engine == "sim" and [r.port for r in f.replicas] == [5001, 5002]
    assert (f.gateway.host, f.gateway.port) == ("127.0.0.1", 5000)
