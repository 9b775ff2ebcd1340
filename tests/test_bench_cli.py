"""`servefleet bench` as a user runs it: a real process, real files, clear errors, Ctrl-C."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from servefleet.bench.cli import register as register_bench
from servefleet.bench.testserver import spawn_test_server
from servefleet.records import read_jsonl
from servefleet.report.cli import register as register_report

ENV = {**os.environ, "COLUMNS": "200"}


def bench_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "servefleet.bench", "bench", *args]


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        bench_cmd(*args), capture_output=True, text=True, timeout=timeout, env=ENV
    )


@pytest.fixture(scope="module")
def server():
    with spawn_test_server("--ttft", "0.005", "--itl", "0.001") as s:
        yield s.url


def test_register_adds_bench_and_report_to_an_app():
    app = typer.Typer()
    register_bench(app)
    register_report(app)
    out = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"})
    assert out.exit_code == 0 and "bench" in out.output and "report" in out.output
    out = CliRunner().invoke(app, ["report", "--help"], env={"COLUMNS": "200"})
    assert all(c in out.output for c in ("show", "html", "compare"))


def test_a_small_sweep_writes_summary_and_records(server, tmp_path: Path):
    out = tmp_path / "run"
    p = run(
        "--url",
        server,
        "--input-len",
        "20",
        "--output-len",
        "8",
        "--concurrency",
        "1,4",
        "--duration",
        "1",
        "--warmup",
        "0.2",
        "--out",
        str(out),
    )
    assert p.returncode == 0, p.stderr
    assert "c=4" in p.stdout and "client self-checks" in p.stdout and "server /metrics" in p.stdout
    s = json.loads((out / "summary.json").read_text())
    assert s["kind"] == "bench" and [pt["load"]["concurrency"] for pt in s["points"]] == [1, 4]
    assert s["points"][1]["selfcheck"]["offered_rate"] > 0
    assert s["points"][1]["server"]["prefix_hit_rate"] == pytest.approx(0.5)
    recs = list(read_jsonl(out / "records-c4.jsonl.gz"))
    assert len(recs) == s["points"][1]["records"] > 8 and all(r.ok for r in recs)


def test_slo_classes_judge_each_named_class_on_its_own(server, tmp_path: Path):
    """--slo-classes: only the named classes count, each under its own SLO; the run keeps them
    and `report show` gives the same verdict."""
    out = tmp_path / "run"
    p = run(
        *("--url", server, "--workload", "chat-3tier", "--rate", "20", "--duration", "1"),
        *("--warmup", "0.2", "--slo-classes", "balanced:ttft=0.000001,decode-heavy"),
        *("--out", str(out)),
    )
    assert p.returncode == 0, p.stderr
    text = " ".join(p.stdout.split())
    assert "SLOs of classes balanced, decode-heavy, each on its own" in text
    assert "held at no point: at 20 req/s, class balanced: TTFT P95" in text
    assert not re.search(r"class decode-heavy: TTFT P95 [\d.]+ \w+ >", text)  # it met its SLO
    s = json.loads((out / "summary.json").read_text())
    assert s["settings"]["slo_classes"] == {
        "balanced": {"ttft": 1e-06, "itl": 0.1},
        "decode-heavy": {"ttft": 2.0, "itl": 0.1},
    }
    shown = subprocess.run(
        [sys.executable, "-m", "servefleet.cli", "report", "show", str(out)],
        capture_output=True, text=True, timeout=60, env=ENV,
    )  # fmt: skip
    assert "held at no point: at 20 req/s, class balanced: TTFT P95" in " ".join(
        shown.stdout.split()
    )


def test_malformed_workload_yaml_is_a_clear_error(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("classes:\n  a: {prompt: 10, output: [1, 2\n")
    p = run("--workload", str(bad), "--url", "http://127.0.0.1:9")
    assert p.returncode == 2 and "invalid YAML" in p.stderr and "bad.yaml:" in p.stderr


def test_missing_dataset_file_is_a_clear_error(tmp_path: Path):
    wl = tmp_path / "w.yaml"
    wl.write_text("classes:\n  a:\n    dataset: {type: sharegpt, path: nowhere.json}\n")
    p = run("--workload", str(wl), "--url", "http://127.0.0.1:9")
    assert p.returncode == 2 and "nowhere.json" in p.stderr


def test_unreachable_server_is_a_clear_error():
    p = run(
        "--url", "http://127.0.0.1:9", "--input-len", "8", "--output-len", "4", "--concurrency", "1"
    )
    assert p.returncode == 2 and "cannot reach http://127.0.0.1:9" in p.stderr
    assert "Traceback" not in p.stderr


def test_a_server_that_fails_every_request_is_reported(tmp_path: Path):
    with spawn_test_server("--fail-every", "1") as s:
        p = run(
            "--url",
            s.url,
            "--input-len",
            "8",
            "--output-len",
            "4",
            "--concurrency",
            "2",
            "--requests",
            "6",
            "--duration",
            "0",
            "--out",
            str(tmp_path / "r"),
        )
    assert p.returncode == 1
    assert (
        "every request failed (6 of 6)" in p.stderr and "HTTP 500: injected fault 500" in p.stderr
    )
    assert re.search(r"HTTP 500\W+6\W", p.stdout)
    assert len(list(read_jsonl(tmp_path / "r" / "records-c2.jsonl.gz"))) == 6


def test_ctrl_c_still_writes_the_records_gathered_so_far(tmp_path: Path):
    out = tmp_path / "run"
    with spawn_test_server("--ttft", "0.01", "--itl", "0.01") as s:
        proc = subprocess.Popen(
            bench_cmd(
                "--url",
                s.url,
                "--input-len",
                "20",
                "--output-len",
                "50",
                "--concurrency",
                "4",
                "--duration",
                "120",
                "--warmup",
                "0",
                "--out",
                str(out),
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
        )
        seen = threading.Event()
        err_lines: list[str] = []

        def watch() -> None:
            for line in proc.stderr:
                err_lines.append(line)
                if line.startswith("first response after"):
                    seen.set()

        t = threading.Thread(target=watch, daemon=True)
        t.start()
        drain = threading.Thread(target=proc.stdout.read, daemon=True)
        drain.start()
        assert seen.wait(60), "".join(err_lines)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        t.join(10)
        drain.join(10)
    assert proc.returncode == 130, "".join(err_lines)
    assert any("interrupted" in x for x in err_lines)
    s = json.loads((out / "summary.json").read_text())
    assert s["interrupted"] is True and s["points"][0]["interrupted"] is True
    recs = list(read_jsonl(out / "records-c4.jsonl.gz"))
    assert any(r.ok for r in recs)
    assert any(r.status == "aborted" for r in recs)  # in flight at Ctrl-C: aborted, kept
    assert len(recs) == s["points"][0]["records"]
