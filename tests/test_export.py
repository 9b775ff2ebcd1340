"""servefleet export: nginx.conf in front of real sim-servers (real Nginx), compose and k8s."""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from servefleet.fleet.cli import register
from servefleet.fleet.commands import free_ports
from servefleet.fleet.export import compose, k8s, nginx_conf
from servefleet.plan.fleet_yaml import Fleet, dump_fleet

READY = re.compile(r"sim-server ready: .* port=(\d+)")


def make_fleet(ports: list[int], engine: str = "vllm", pools=None) -> Fleet:
    n = len(ports) - 1
    pools = pools or ["default"] * n
    return Fleet.model_validate(
        {
            "model": {"name": "Qwen2.5-7B", "path": "Qwen/Qwen2.5-7B-Instruct"},
            "engine": engine,
            "gpus": {"type": "H200-SXM", "count": 8},
            "vllm": {"max_model_len": 4096, "max_num_seqs": 64, "max_num_batched_tokens": 2048},
            "replicas": [
                {
                    "name": f"replica-{i}",
                    "tp": 2,
                    "gpu_ids": [2 * i, 2 * i + 1],
                    "port": p,
                    "pool": pools[i],
                }
                for i, p in enumerate(ports[:n])
            ],
            "gateway": {"host": "127.0.0.1", "port": ports[n]},
        }
    )


def test_compose_pins_gpus_and_checks_health() -> None:
    doc = yaml.safe_load(compose(make_fleet([8001, 8002, 8000])))
    svcs = doc["services"]
    assert set(svcs) == {"replica-0", "replica-1", "gateway"}
    r1 = svcs["replica-1"]
    dev = r1["deploy"]["resources"]["reservations"]["devices"][0]
    assert dev["device_ids"] == ["2", "3"] and dev["capabilities"] == ["gpu"]
    assert "--tensor-parallel-size" in r1["command"] and "Qwen/Qwen2.5-7B-Instruct" in r1["command"]
    assert "8002/health" in r1["healthcheck"]["test"][1]
    gw = svcs["gateway"]
    assert gw["depends_on"]["replica-0"] == {"condition": "service_healthy"}
    assert "--replica=http://replica-1:8002" in gw["command"]


def test_k8s_groups_replicas_with_gpu_requests_and_probes() -> None:
    docs = list(
        yaml.safe_load_all(
            k8s(make_fleet([8001, 8002, 8003, 8000], pools=["default", "default", "long"]))
        )
    )
    kinds = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert ("Deployment", "qwen2-5-7b-tp2-default") in kinds
    assert ("Deployment", "qwen2-5-7b-tp2-long") in kinds
    assert ("Service", "servefleet-gateway") in kinds
    dep = next(d for d in docs if d["metadata"]["name"] == "qwen2-5-7b-tp2-default")
    assert dep["spec"]["replicas"] == 2
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    for d in docs:  # the fields every manifest needs
        assert d["apiVersion"] and d["metadata"]["name"]
        if d["kind"] == "Deployment":
            sel = d["spec"]["selector"]["matchLabels"]
            assert sel.items() <= d["spec"]["template"]["metadata"]["labels"].items()


def test_export_cli_writes_files(tmp_path: Path) -> None:
    f = tmp_path / "fleet.yaml"
    f.write_text(dump_fleet(make_fleet([8001, 8000])))
    app = typer.Typer()
    register(app)
    for what in ("nginx", "compose", "k8s"):
        out = tmp_path / f"{what}.out"
        r = CliRunner().invoke(app, ["export", what, str(tmp_path), "--out", str(out)])
        assert r.exit_code == 0, r.output
        assert out.read_text().startswith("#")


def _start_sim(tmp: Path, i: int, stack: ExitStack) -> int:
    err = open(tmp / f"sim-{i}.log", "w")  # noqa: SIM115
    stack.callback(err.close)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "servefleet.sim.server",
            "--model",
            "Qwen2.5-7B",
            "--gpu",
            "H200-SXM",
            "--port",
            "0",
            "--startup-time",
            "0",
            "--time-scale",
            "20",
        ],
        stdout=subprocess.PIPE,
        stderr=err,
        text=True,
        start_new_session=True,
    )

    def stop():
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    stack.callback(stop)
    ready, _, _ = select.select([proc.stdout], [], [], 60)
    assert ready, "sim-server did not print its ready line"
    m = READY.search(proc.stdout.readline())
    assert m, (tmp / f"sim-{i}.log").read_text()[-2000:]
    return int(m.group(1))


def _served(port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:request_success_total")
    )


def _post(url: str, body: dict, session: str) -> dict:
    req = urllib.request.Request(
        url,
        json.dumps(body).encode(),
        {"Content-Type": "application/json", "X-Session-Id": session},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


@pytest.mark.skipif(shutil.which("nginx") is None, reason="nginx is not installed")
def test_nginx_conf_in_front_of_sim_servers(tmp_path: Path) -> None:
    with ExitStack() as stack:
        ports = [_start_sim(tmp_path, i, stack) for i in range(3)]
        listen = free_ports(1)[0]
        fleet = make_fleet([*ports, listen], pools=["default", "default", "long"])
        prefix = tmp_path / "nginx"
        prefix.mkdir()
        conf = prefix / "nginx.conf"
        conf.write_text(nginx_conf(fleet, listen=listen))
        check = subprocess.run(
            ["nginx", "-t", "-p", str(prefix), "-c", str(conf)], capture_output=True, text=True
        )
        assert check.returncode == 0, check.stderr
        ng = subprocess.Popen(
            ["nginx", "-p", str(prefix), "-c", str(conf), "-g", "daemon off;"],
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

        def stop_nginx():
            if ng.poll() is None:
                os.killpg(ng.pid, signal.SIGQUIT)
                try:
                    ng.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(ng.pid, signal.SIGKILL)
                    ng.wait()

        stack.callback(stop_nginx)
        base = f"http://127.0.0.1:{listen}"
        deadline = time.monotonic() + 20
        while True:  # nginx prints no ready line: its health location is the signal
            try:
                if urllib.request.urlopen(base + "/nginx-health", timeout=1).status == 200:
                    break
            except OSError:
                pass
            assert ng.poll() is None, ng.stderr.read()
            assert time.monotonic() < deadline, "nginx did not answer"
            time.sleep(0.05)
        body = {"model": "Qwen2.5-7B", "prompt": "hello world", "max_tokens": 3}

        def batch(session: str, n: int, payload: dict) -> list[float]:
            before = [_served(p) for p in ports]
            for _ in range(n):
                r = _post(base + "/v1/completions", payload, session)
                assert r["usage"]["completion_tokens"] == 3
            return [_served(p) - b for p, b in zip(ports, before, strict=True)]

        # each session sticks to one replica of the default pool
        for session in ("user-a", "user-b", "user-c"):
            delta = batch(session, 4, body)
            assert sorted(delta[:2]) == [0, 4] and delta[2] == 0, (session, delta)
        # a long prompt (by body size) goes to the long pool
        assert batch("user-a", 1, {**body, "prompt": "word " * 3000}) == [0, 0, 1]
        # streaming passes through unbuffered
        req = urllib.request.Request(
            base + "/v1/completions",
            json.dumps({**body, "stream": True}).encode(),
            {"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            events = [x for x in r.read().decode().split("\n\n") if x.strip()]
        assert events[-1] == "data: [DONE]" and len(events) >= 4
