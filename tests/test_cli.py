"""The command line as a user runs it: a real process, real files, clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import typer

from servefleet.records import read_jsonl


def run_cli(*args: str, timeout: float = 120, columns: int = 200) -> subprocess.CompletedProcess:
    keep = {k: os.environ[k] for k in ("PYTHONPATH", "SERVEFLEET_PURE_PYTHON") if k in os.environ}
    return subprocess.run(
        [sys.executable, "-m", "servefleet.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={"COLUMNS": str(columns), "PATH": "/usr/bin:/bin", **keep},
    )


def test_simulate_small_sweep_writes_summary_and_records(tmp_path: Path):
    out = tmp_path / "run"
    p = run_cli(
        "simulate",
        "--concurrency",
        "1,8",
        "--duration",
        "60",
        "--warmup",
        "5",
        "--explain",
        "--out",
        str(out),
    )
    assert p.returncode == 0, p.stderr
    assert "has no bf16" in p.stdout and "KV blocks" in p.stdout and "c=8" in p.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["deployment"]["tp"] == 2 and summary["deployment"]["replicas"] == 4
    assert [pt["load"]["concurrency"] for pt in summary["points"]] == [1, 8]
    recs = list(read_jsonl(out / "records-c8.jsonl.gz"))
    assert len(recs) == summary["points"][1]["records"] > 20
    assert all(r.ok and r.output_tokens == len(r.chunk_times) for r in recs)


def test_simulate_fixed_lengths_and_rates(tmp_path: Path):
    p = run_cli(
        "simulate",
        "--model",
        "Qwen-7B",
        "--tp",
        "1",
        "--input-len",
        "512",
        "--output-len",
        "64",
        "--rate",
        "2,4",
        "--duration",
        "30",
        "--warmup",
        "2",
        "--out",
        str(tmp_path / "r"),
    )
    assert p.returncode == 0, p.stderr
    assert "8 replica(s) x TP=1" in p.stdout and "4 req/s" in p.stdout


def test_bad_input_gets_a_clear_message_not_a_traceback():
    cases = [
        (["simulate", "--gpu", "V100-SXM3"], "V100"),
        (["simulate", "--model", "Qwen9-1B"], "Qwen"),
        (["simulate", "--tp", "3"], "divide"),
        (["simulate", "--num-gpus", "8", "--tp", "2", "--replicas", "5"], "need 10 GPUs"),
        (["simulate", "--model", "Llama-2-70B", "--tp", "1"], "does not fit"),
        (["simulate", "--concurrency", "1,x"], "--concurrency"),
        (["simulate", "--workload", "/nonexistent.yaml"], "nonexistent"),
        (["simulate", "--input-len", "512"], "go together"),
        (["simulate", "--input-len", "0", "--output-len", "64"], "greater than 0"),
        (["simulate", "--concurrency", "1", "--rate", "2"], "not both"),
        (["simulate", "--gpu-memory-utilization", "1.5"], "at most 1, got 1.5"),
        (["simulate", "--duration", "0"], "greater than 0"),
        (["simulate", "--gpu-param", "efficiency.nope=1"], "unknown parameter"),
        (["simulate", "--gpu-param", "efficiency.gemm_max"], "NAME=NUMBER"),
        (["simulate", "--slo-classes", "chat"], "not classes of chat-3tier"),
        (["simulate", "--slo-classes", "balanced:ttft=-1"], "ttft=SECONDS"),
        (["plan", "--max-num-seqs", "0"], "'--max-num-seqs': must be greater than 0, got 0"),
        (["plan", "--slo-percentile", "100"], "between 0 and 100"),
        (["plan", "--slo-ttft", "nan"], "greater than 0, got nan"),
        (["plan", "--num-gpus", "0"], "greater than 0"),
        (["plan", "--rel-tol", "0"], "greater than 0"),
        (["plan", "--claim", "rate=-3"], "a number > 0"),
        (["bench", "--timeout", "-1"], "greater than 0"),
        (["bench", "--warmup", "-5"], "0 or more"),
    ]
    for args, needle in cases:
        p = run_cli(*args)
        assert p.returncode == 2, (args, p.stdout, p.stderr)
        assert needle in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)


def test_catalog_listings():
    for cmd, needle in (
        ("gpus", "H200-SXM"),
        ("models", "Qwen1.5-14B"),
        ("workloads", "chat-3tier"),
    ):
        p = run_cli(cmd)
        assert p.returncode == 0 and needle in p.stdout, p.stderr
        narrow = run_cli(cmd, columns=80)  # fits 80 columns: nothing cut, nothing wider
        assert needle in narrow.stdout and "…" not in narrow.stdout, narrow.stdout
        assert max(len(line) for line in narrow.stdout.splitlines()) <= 80


def test_simulate_and_bench_declare_their_shared_options_once():
    from typer.testing import CliRunner

    from servefleet.cli import app

    def options(command: str) -> dict[str, tuple]:
        params = typer.main.get_command(app).commands[command].params
        return {p.name: (p.opts, p.help, p.default) for p in params}

    sim, bench = options("simulate"), options("bench")
    for name in (
        "workload",
        "input_len",
        "output_len",
        "concurrency",
        "rate",
        "slo_ttft",
        "slo_itl",
        "seed",
    ):
        assert sim[name] == bench[name], name
    out = CliRunner().invoke(app, ["bench", "--help"], env={"COLUMNS": "200"})
    assert out.exit_code == 0 and "1,2,4,8,16,32,64,128" in out.output


def test_simulate_a_fleet_yaml_with_replicas_sharing_a_gpu(tmp_path: Path):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "model: {name: Qwen2.5-7B, path: /models/x}\n"
        "gpus: {type: H200-SXM, count: 1}\n"
        "vllm: {max_model_len: 8192, max_num_seqs: 1024, max_num_batched_tokens: 8192,\n"
        "       gpu_memory_utilization: 0.45}\n"
        "replicas:\n"
        "  - {name: a, tp: 1, gpu_ids: [0], port: 8001}\n"
        "  - {name: b, tp: 1, gpu_ids: [0], port: 8002}\n"
        "gateway: {policy: round-robin}\n"
    )
    out = tmp_path / "run"
    p = run_cli(
        "simulate",
        "--fleet",
        str(fleet),
        "--concurrency",
        "4",
        "--duration",
        "20",
        "--warmup",
        "2",
        "--out",
        str(out),
    )
    assert p.returncode == 0, p.stderr
    assert "2 replica(s) x TP=1 (2 per GPU)" in p.stdout and "on 1 x H200-SXM" in p.stdout
    dep = json.loads((out / "summary.json").read_text())["deployment"]
    assert dep["replicas_per_gpu"] == 2 and dep["gpu_memory_utilization"] == 0.45
    assert {r.replica for r in read_jsonl(out / "records-c4.jsonl.gz")} == {
        "replica-0",
        "replica-1",
    }
    bad = tmp_path / "bad.yaml"
    bad.write_text(fleet.read_text().replace("0.45", "0.6"))
    p = run_cli("simulate", "--fleet", str(bad))
    assert p.returncode == 2 and "at most 0.50" in p.stderr
