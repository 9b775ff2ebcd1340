"""servefleet export: nginx.conf in front of real sim-servers (real Nginx), compose and k8s."""

from __future__ import annotations

import json
import re
import subprocess
import sys
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
from servefleet.fleet.export import compose, k8s
from servefleet.fleet.export_k8s import HostsError
from servefleet.fleet.images import vllm_image
from servefleet.gateway.config import GatewayConfig, RateLimitConfig, parse_config
from servefleet.plan.fleet_yaml import Fleet, dump_fleet

READY = re.compile(r"sim-server ready: .* port=(\d+)")


def make_fleet(
    ports: list[int],
    engine: str = "vllm",
    pools=None,
    cap: int | None = None,
    policy: str = "least-outstanding",
    rate_limit: dict | None = None,
) -> Fleet:
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
            "gateway": {
                "host": "127.0.0.1",
                "port": ports[n],
                "max_in_flight_per_replica": cap,
                "policy": policy,
                "rate_limit": rate_limit,
            },
        }
    )


def _gateway_cfg_of_compose(doc: dict) -> GatewayConfig:
    (mount,) = doc["services"]["gateway"]["configs"]
    assert doc["services"]["gateway"]["command"][-1] == mount["target"]
    return parse_config(yaml.safe_load(doc["configs"][mount["source"]]["content"]))


def _gateway_cfg_of_k8s(docs: list[dict]) -> GatewayConfig:
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap"]
    (text,) = cm["data"].values()
    return parse_config(yaml.safe_load(text))


def test_compose_pins_gpus_checks_health_and_keeps_routing_and_the_cap() -> None:
    fleet = make_fleet([8001, 8002, 8000], cap=24)
    doc = yaml.safe_load(compose(fleet))
    svcs = doc["services"]
    assert set(svcs) == {"replica-0", "replica-1", "gateway"}
    r1 = svcs["replica-1"]
    dev = r1["deploy"]["resources"]["reservations"]["devices"][0]
    assert dev["device_ids"] == ["2", "3"] and dev["capabilities"] == ["gpu"]
    assert "--tensor-parallel-size" in r1["command"] and "Qwen/Qwen2.5-7B-Instruct" in r1["command"]
    assert "8002/health" in r1["healthcheck"]["test"][-1]
    gw = svcs["gateway"]
    # the gateway starts with the replicas: its /ready names those still loading
    assert gw["depends_on"]["replica-0"] == {"condition": "service_started"}
    # the gateway gets what `servefleet up` gives it: each replica by its own address, its
    # pool and the cap (the config is one the gateway accepts)
    cfg = _gateway_cfg_of_compose(doc)
    assert [(r.url, r.name, r.pool, r.max_in_flight) for r in cfg.replicas] == [
        ("http://replica-0:8001", "replica-0", "default", 24),
        ("http://replica-1:8002", "replica-1", "default", 24),
    ]
    assert cfg.host == "0.0.0.0" and cfg.port == 8000 and not cfg.rate_limit.enabled
    # beyond loopback /fleet and /metrics need the admin token: from the environment, never
    # the config file; unset, it is empty, which the gateway reads as "no token"
    assert cfg.admin_token is None
    assert gw["environment"] == {"SERVEFLEET_ADMIN_TOKEN": "${SERVEFLEET_ADMIN_TOKEN:-}"}
    # per-user limits: a Redis service holds the buckets
    fleet.gateway.rate_limit = RateLimitConfig(requests_per_second=2, request_burst=5)
    doc = yaml.safe_load(compose(fleet))
    rl = _gateway_cfg_of_compose(doc).rate_limit
    assert (rl.requests_per_second, rl.request_burst, rl.redis_url) == (
        2,
        5,
        "redis://redis:6379/0",
    )
    assert "redis" in doc["services"]["gateway"]["depends_on"] and "redis" in doc["services"]


def test_k8s_statefulsets_headless_services_and_gateway_discovery() -> None:
    fleet = make_fleet([8001, 8002, 8003, 8000], pools=["default", "default", "long"], cap=24)
    docs = list(yaml.safe_load_all(k8s(fleet, gateways=2)))
    kinds = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert ("StatefulSet", "qwen2-5-7b-tp2-default") in kinds
    assert ("StatefulSet", "qwen2-5-7b-tp2-long") in kinds
    assert ("Service", "servefleet-gateway") in kinds
    assert ("Role", "servefleet-gateway") in kinds
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    assert sts["spec"]["replicas"] == 2
    assert sts["spec"]["serviceName"] == "qwen2-5-7b-tp2-default"
    svc = next(
        d
        for d in docs
        if d["kind"] == "Service" and d["metadata"]["name"] == "qwen2-5-7b-tp2-default"
    )
    assert svc["spec"]["clusterIP"] == "None"  # headless: each pod has its own endpoint
    pod = sts["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1800  # model loading
    # the gateway discovers each group's pods and keeps pool and cap (24 // 2 gateways each)
    cfg = _gateway_cfg_of_k8s(docs)
    k = cfg.discovery.kubernetes
    assert [
        (s.service, s.port, s.replica["pool"], s.replica["max_in_flight"]) for s in k.services
    ] == [
        ("qwen2-5-7b-tp2-default", "http", "default", 12),
        ("qwen2-5-7b-tp2-long", "http", "long", 12),
    ]
    gw = next(
        d
        for d in docs
        if d["kind"] == "Deployment" and d["metadata"]["name"] == "servefleet-gateway"
    )
    assert gw["spec"]["replicas"] == 2
    assert gw["spec"]["template"]["spec"]["serviceAccountName"] == "servefleet-gateway"
    # the admin token: a file of a Secret, never in the ConfigMap nor the environment
    pod = gw["spec"]["template"]["spec"]
    assert "env" not in pod["containers"][0] and cfg.admin_token is None
    assert cfg.admin_token_file == "/etc/servefleet/admin/token"
    assert {"name": "admin", "secret": {"secretName": "servefleet-gateway-admin",
            "optional": True}} in pod["volumes"]  # fmt: skip
    for d in docs:  # the fields every manifest needs
        assert d["apiVersion"] and d["metadata"]["name"]
        if d["kind"] in ("Deployment", "StatefulSet"):
            sel = d["spec"]["selector"]["matchLabels"]
            assert sel.items() <= d["spec"]["template"]["metadata"]["labels"].items()


def test_k8s_16_gpus_on_2_nodes_of_v100() -> None:
    """`servefleet export k8s --hosts 2` of a one-host fleet of 8 V100s (4 x TP=2): 8
    replicas on 2 nodes, the V100's vLLM image, node selector and a Redis for the limits."""
    fleet = Fleet.model_validate(
        {
            "model": {"name": "Qwen1.5-14B", "path": "Qwen/Qwen1.5-14B-Chat"},
            "gpus": {"type": "V100-SXM2-32G", "count": 8},
            "vllm": {"dtype": "half", "max_model_len": 4096, "max_num_seqs": 32,
                     "max_num_batched_tokens": 512},
            "replicas": [{"name": f"replica-{i}", "tp": 2, "gpu_ids": [2 * i, 2 * i + 1],
                          "port": 8001 + i} for i in range(4)],
            "gateway": {"max_in_flight_per_replica": 32,
                        "rate_limit": {"requests_per_second": 2, "burst": 10}},
        }
    )  # fmt: skip
    docs = list(yaml.safe_load_all(k8s(fleet, hosts=2, gateways=2)))
    (sts,) = [d for d in docs if d["kind"] == "StatefulSet"]
    assert sts["spec"]["replicas"] == 8
    pod = sts["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "vllm/vllm-openai:v0.19.1"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "Tesla-V100-SXM2-32GB"}
    # 4 CPUs per GPU; host memory for its half of the 28 GB of weights + 16 GiB
    assert pod["containers"][0]["resources"]["limits"] == {
        "nvidia.com/gpu": 2,
        "cpu": "8",
        "memory": "30Gi",
    }
    assert ("Deployment", "servefleet-redis") in [(d["kind"], d["metadata"]["name"]) for d in docs]
    cfg = _gateway_cfg_of_k8s(docs)
    assert cfg.rate_limit.redis_url == "redis://servefleet-redis:6379/0"
    assert cfg.discovery.kubernetes.services[0].replica["max_in_flight"] == 16
    with pytest.raises(HostsError):
        k8s(
            fleet.model_copy(
                update={
                    "replicas": [
                        fleet.replicas[0],
                        fleet.replicas[1].model_copy(update={"host": "gpu-b"}),
                    ]
                }
            ),
            hosts=3,
        )


def test_vllm_image_by_gpu_generation() -> None:
    assert vllm_image("V100-SXM2-32G")[0] == "vllm/vllm-openai:v0.19.1"
    assert vllm_image("v100")[0] == "vllm/vllm-openai:v0.19.1"
    assert vllm_image("T4")[0] == vllm_image("H200-SXM")[0] == "vllm/vllm-openai:v0.26.0"


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
    rate_limit: dict | None = None,
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
            "gateway": {"port": 8000, "policy": policy, "rate_limit": rate_limit},
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
    "sim-rate-limited": _fleet(
        "sim",
        [(2, 1, "default")],
        rate_limit={"requests_per_second": 0.5, "tokens_per_minute": 1e4},
    ),
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
    redis = 1 if fleet.gateway.rate_limit.enabled else 0
    assert len(doc["services"]) == len(fleet.replicas) + 1 + redis  # no two share a name


def _k8s_reference_errors(docs: list[dict]) -> list[str]:
    """What `kubectl apply` of the whole file relies on across objects and no schema checks:
    every name an object refers to exists, selectors select, named ports are declared."""
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    errors = []
    workloads = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]

    def pods_of(selector: dict) -> list[dict]:
        return [
            w["spec"]["template"]
            for w in workloads
            if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()
        ]

    def port_names(pod: dict) -> set:
        return {p.get("name") for c in pod["spec"]["containers"] for p in c.get("ports", [])}

    for d in docs:
        name = f"{d['kind']}/{d['metadata']['name']}"
        if d["kind"] == "Service":
            pods = pods_of(d["spec"]["selector"])
            if not pods:
                errors.append(f"{name}: its selector matches no pod template")
            for p in d["spec"]["ports"]:
                t = p.get("targetPort")
                if isinstance(t, str) and any(t not in port_names(pod) for pod in pods):
                    errors.append(f"{name}: targetPort {t!r} is not a container port")
        if d["kind"] == "StatefulSet":
            svc = by.get(("Service", d["spec"]["serviceName"]))
            if svc is None or svc["spec"].get("clusterIP") != "None":
                errors.append(f"{name}: serviceName is not a headless Service")
        if d["kind"] in ("Deployment", "StatefulSet"):
            pod = d["spec"]["template"]["spec"]
            sa = pod.get("serviceAccountName")
            if sa and ("ServiceAccount", sa) not in by:
                errors.append(f"{name}: no ServiceAccount {sa}")
            for v in pod.get("volumes", []):
                if "configMap" in v and ("ConfigMap", v["configMap"]["name"]) not in by:
                    errors.append(f"{name}: no ConfigMap {v['configMap']['name']}")
            for c in pod["containers"]:
                for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                    port = (c.get(probe, {}).get("httpGet") or {}).get("port")
                    if isinstance(port, str) and port not in port_names(d["spec"]["template"]):
                        errors.append(f"{name}: {probe} port {port!r} is not declared")
        if d["kind"] == "RoleBinding":
            if ("Role", d["roleRef"]["name"]) not in by:
                errors.append(f"{name}: no Role {d['roleRef']['name']}")
            for sub in d["subjects"]:
                if (sub["kind"], sub["name"]) not in by:
                    errors.append(f"{name}: no {sub['kind']} {sub['name']}")
        if d["kind"] == "ConfigMap":  # the gateway's: its discovery names headless Services
            for src in _gateway_cfg_of_k8s(docs).discovery.kubernetes.services:
                svc = by.get(("Service", src.service))
                if svc is None or src.port not in {p["name"] for p in svc["spec"]["ports"]}:
                    errors.append(f"{name}: discovers {src.service}:{src.port}, not a Service port")
    return errors


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("name", FLEETS)
def test_k8s_manifests_match_the_kubernetes_schemas(name: str, version: str) -> None:
    fleet = FLEETS[name]
    docs = list(yaml.safe_load_all(k8s(fleet)))
    groups = {(r.tp, r.pool) for r in fleet.replicas}
    redis = ["Deployment", "Service"] if fleet.gateway.rate_limit.enabled else []
    assert [d["kind"] for d in docs] == [
        "ServiceAccount", "Role", "RoleBinding", *redis,
        *["Service", "StatefulSet"] * len(groups),
        "ConfigMap", "Deployment", "Service",
        "NetworkPolicy", "NetworkPolicy", *["NetworkPolicy"] * bool(redis),
    ]  # fmt: skip
    for d in docs:
        assert _k8s_errors(d, version) == [], d["metadata"]["name"]
    assert _k8s_reference_errors(docs) == []
    # what the API server checks beyond the OpenAPI schema: object names (a Service's is a
    # DNS-1035 label) and label values, distinct per kind
    names = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert len(set(names)) == len(names), names
    values = [n for _, n in names]
    values += [v for d in docs for v in d["metadata"].get("labels", {}).values()]
    for v in values:
        assert DNS_1035_LABEL.fullmatch(v) and len(v) <= 63, v


def test_the_reference_checks_catch_broken_references() -> None:
    docs = list(yaml.safe_load_all(k8s(FLEETS["sim-rate-limited"])))
    assert _k8s_reference_errors(docs) == []
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    sts["spec"]["serviceName"] = "nope"
    gw = next(
        d
        for d in docs
        if d["metadata"]["name"] == "servefleet-gateway" and d["kind"] == "Deployment"
    )
    gw["spec"]["template"]["spec"]["serviceAccountName"] = "nobody"
    svc = next(
        d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "servefleet-redis"
    )
    svc["spec"]["ports"][0]["targetPort"] = "redis-typo"
    errors = "\n".join(_k8s_reference_errors(docs))
    assert "serviceName is not a headless Service" in errors
    assert "no ServiceAccount nobody" in errors
    assert "targetPort 'redis-typo'" in errors


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
    dep = next(d for d in docs if d["kind"] == "StatefulSet")
    svc = next(d for d in docs if d["kind"] == "Service")
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
