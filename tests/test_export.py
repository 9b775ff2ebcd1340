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
from functools import cache
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path

import jsonschema
import pytest
import typer
import yaml
from referencing import Registry, Resource
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


# --- validation against the official schemas -------------------------------------------------
# compose: the Compose Specification's JSON schema (compose-spec/compose-spec, schema/
# compose-spec.json) as vendored by check-jsonschema; Kubernetes: the OpenAPI-derived JSON schemas
# shipped by kubernetes-validate, strict variant (unknown fields are errors), for the oldest and
# the newest Kubernetes version it ships. Both come from PyPI (pyproject's `test` extra).
K8S_VERSIONS = ("1.25", "1.37")
DNS_1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


def _fleet(
    engine: str,
    groups: list[tuple[int, int, str]],
    policy: str = "round-robin",
    names: list[str] | None = None,
    model: str = "Qwen2.5-7B",
) -> Fleet:
    """A fleet of `count` replicas of TP `tp` in `pool` per (count, tp, pool), GPUs in order."""
    replicas, gpu = [], 0
    for count, tp, pool in groups:
        for _ in range(count):
            i = len(replicas)
            replicas.append(
                {
                    "name": names[i] if names else f"replica-{i}",
                    "tp": tp,
                    "gpu_ids": list(range(gpu, gpu + tp)),
                    "port": 8001 + i,
                    "pool": pool,
                }
            )
            gpu += tp
    return Fleet.model_validate(
        {
            "model": {"name": model, "path": "Qwen/Qwen2.5-7B-Instruct"},
            "engine": engine,
            "gpus": {"type": "H200-SXM", "count": 8},
            "vllm": {"max_model_len": 4096, "max_num_seqs": 64, "max_num_batched_tokens": 2048},
            "replicas": replicas,
            "gateway": {"port": 8000, "policy": policy},
        }
    )


FLEETS = {
    "vllm-tp2x2-default-tp2-long": make_fleet(
        [8001, 8002, 8003, 8000], pools=["default", "default", "long"]
    ),
    "vllm-tp1x4-default-tp2x2-long": _fleet(
        "vllm", [(4, 1, "default"), (2, 2, "long")], policy="length-pools"
    ),
    "vllm-tp8": _fleet("vllm", [(1, 8, "default")]),
    "sim-tp1x3-default-tp2-long": _fleet(
        "sim", [(3, 1, "default"), (1, 2, "long")], policy="length-pools"
    ),
    "sim-tp1": _fleet("sim", [(1, 1, "default")]),
    "vllm-odd-names": _fleet(
        "vllm",
        [(1, 1, "default"), (1, 1, "default"), (1, 1, "Long"), (1, 1, "long"), (1, 4, "__")],
        names=["réplica 0", "gateway", "Replica_2", "replica-2", "__"],
        model="70B/Some-Very-Long-Model-Name-Instruct-2512/config.json",
    ),
}


@cache
def _compose_validator() -> jsonschema.Draft202012Validator:
    schema = files("check_jsonschema.builtin_schemas.vendor").joinpath("compose-spec.json")
    return jsonschema.Draft202012Validator(json.loads(schema.read_text()))


@cache
def _k8s_schemas(version: str) -> tuple[Traversable, Registry]:
    """kubernetes-validate's strict schemas of `version` and a registry holding their shared
    definitions, loaded once (kubernetes_validate.validate reloads them for every document)."""
    root = files("kubernetes_validate") / "kubernetes-json-schema" / f"v{version}.0-local-strict"
    assert root.is_dir(), f"kubernetes-validate ships no schemas for Kubernetes {version}"
    defs = Resource.from_contents(json.loads((root / "_definitions.json").read_text()))
    return root, defs @ Registry()


@cache
def _k8s_validator(version: str, kind: str, api_version: str) -> jsonschema.Draft202012Validator:
    root, registry = _k8s_schemas(version)
    group = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)  # apps/v1 -> apps-v1
    schema = json.loads((root / f"{kind.lower()}-{group}.json").read_text())
    return jsonschema.Draft202012Validator(schema, registry=registry)


def _errors(validator: jsonschema.Draft202012Validator, doc: dict) -> list[str]:
    return [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)
    ]


def _compose_errors(doc: dict) -> list[str]:
    return _errors(_compose_validator(), doc)


def _k8s_errors(doc: dict, version: str) -> list[str]:
    return _errors(_k8s_validator(version, doc["kind"], doc["apiVersion"]), doc)


@pytest.mark.parametrize("name", FLEETS)
def test_compose_matches_the_compose_spec_schema(name: str) -> None:
    fleet = FLEETS[name]
    doc = yaml.safe_load(compose(fleet))
    assert _compose_errors(doc) == []
    assert len(doc["services"]) == len(fleet.replicas) + 1  # no two replicas share a name


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("name", FLEETS)
def test_k8s_manifests_match_the_kubernetes_schemas(name: str, version: str) -> None:
    fleet = FLEETS[name]
    docs = list(yaml.safe_load_all(k8s(fleet)))
    groups = {(r.tp, r.pool) for r in fleet.replicas}
    assert [d["kind"] for d in docs] == ["Deployment", "Service"] * (len(groups) + 1)
    for d in docs:
        assert _k8s_errors(d, version) == [], d["metadata"]["name"]
    # what the API server checks beyond the OpenAPI schema: object names (a Service's is a
    # DNS-1035 label) and label values, distinct per kind
    names = [d["metadata"]["name"] for d in docs]
    assert len(set(names)) == len(names) // 2, names
    values = [*names, *(v for d in docs for v in d["metadata"].get("labels", {}).values())]
    for v in values:
        assert DNS_1035_LABEL.fullmatch(v) and len(v) <= 63, v


def test_the_schemas_reject_broken_documents() -> None:
    """The validators are live: a wrong type, an unknown field, a missing field are errors."""
    fleet = FLEETS["vllm-tp1x4-default-tp2x2-long"]
    doc = yaml.safe_load(compose(fleet))
    assert _compose_errors(doc) == []
    svc = doc["services"]["replica-0"]
    svc["ports"] = 8001  # not a list
    svc["healthcheck"]["retry"] = 3  # a typo of `retries`
    svc["deploy"]["resources"]["reservations"]["devices"][0].pop("capabilities")  # required
    errors = "\n".join(_compose_errors(doc))
    assert "services.replica-0.ports: 8001 is not of type 'array'" in errors, errors
    assert "services.replica-0.healthcheck: 'retry' does not match" in errors, errors
    assert "'capabilities' is a required property" in errors, errors

    version = K8S_VERSIONS[-1]
    docs = list(yaml.safe_load_all(k8s(fleet)))
    dep, svc = docs[0], docs[1]
    assert (dep["kind"], svc["kind"]) == ("Deployment", "Service")
    assert _k8s_errors(dep, version) == _k8s_errors(svc, version) == []
    container = dep["spec"]["template"]["spec"]["containers"][0]
    dep["spec"]["replicas"] = "4"  # a string, not an integer
    container["readinesProbe"] = container.pop("readinessProbe")  # a typo
    del dep["spec"]["selector"]  # required in apps/v1
    errors = "\n".join(_k8s_errors(dep, version))
    assert "spec.replicas: '4' is not of type 'integer', 'null'" in errors, errors
    assert "('readinesProbe' was unexpected)" in errors, errors
    assert "spec: 'selector' is a required property" in errors, errors
    svc["spec"]["ports"][0]["port"] = "http"  # a Service port is a number
    assert _k8s_errors(svc, version) == ["spec.ports.0.port: 'http' is not of type 'integer'"]


def test_exported_files_pass_the_schema_tools(tmp_path: Path) -> None:
    """The files `servefleet export` writes pass the two tools' own command lines — the check a
    user can run (docs/export.md) — and fail them once broken."""
    f = tmp_path / "fleet.yaml"
    f.write_text(dump_fleet(FLEETS["vllm-tp1x4-default-tp2x2-long"]))
    app = typer.Typer()
    register(app)
    out = {"compose": tmp_path / "docker-compose.yaml", "k8s": tmp_path / "k8s.yaml"}
    for what, path in out.items():
        r = CliRunner().invoke(app, ["export", what, str(f), "--out", str(path)])
        assert r.exit_code == 0, r.output
    bin_dir = Path(sys.executable).parent
    checks = {
        "compose": [bin_dir / "check-jsonschema", "--builtin-schema", "vendor.compose-spec"],
        "k8s": [bin_dir / "kubernetes-validate", "--strict", "-k", f"{K8S_VERSIONS[-1]}.0"],
    }
    for what, argv in checks.items():
        p = subprocess.run([*argv, out[what]], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stdout + p.stderr
    text = out["compose"].read_text()
    out["compose"].write_text(text.replace("retries: 3", "retries: [3]", 1))
    text = out["k8s"].read_text()
    out["k8s"].write_text(text.replace("replicas: 4", "replicas: four", 1))
    for what, argv in checks.items():
        p = subprocess.run([*argv, out[what]], capture_output=True, text=True, timeout=60)
        assert p.returncode != 0, (what, p.stdout + p.stderr)
        assert ("[3]" if what == "compose" else "four") in p.stdout + p.stderr


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


def test_nginx_upstream_names_stay_distinct_when_pool_names_differ_only_in_case(
    tmp_path: Path,
) -> None:
    conf = nginx_conf(make_fleet([8001, 8002, 8003, 8000], pools=["default", "Long", "long"]))
    names = re.findall(r"upstream (\S+) \{", conf)
    assert len(names) == 3 == len(set(names)), names
    (long_line,) = [line for line in conf.splitlines() if line.strip().startswith('"~^[0-9]')]
    assert long_line.split()[1].rstrip(";") in names
    if shutil.which("nginx"):
        (tmp_path / "nginx.conf").write_text(conf)
        check = subprocess.run(
            ["nginx", "-t", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf")],
            capture_output=True,
            text=True,
        )
        assert check.returncode == 0, check.stderr


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
