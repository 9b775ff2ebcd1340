"""The exports as a cluster's admission and a security review would read them: a Llama preset
(a gated repository) with API keys and per-key limits, exported for Kubernetes and compose.

Kubernetes: the token comes from a Secret, the weights from a PersistentVolumeClaim sized from
the model's bytes, NetworkPolicies admit only the gateway to the replicas and Redis, and every
container runs as non-root on a read-only root with requests and limits — checked here field by
field and by a policy linter (checkov, installed by `.ci/run` into `.venv-policy`, its own
environment because its dependencies clash with the test environment's). Compose: only the
gateway's port is published, on `gateway.host`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from servefleet.fleet.cli import register
from servefleet.fleet.export import compose, k8s
from servefleet.gateway.config import parse_config
from servefleet.gateway.identity import key_hash
from servefleet.models import load_model
from servefleet.plan.fleet_yaml import Fleet, dump_fleet, load_fleet

ROOT = Path(__file__).resolve().parent.parent
CHECKOV = ROOT / ".venv-policy" / "bin" / "checkov"

# checkov's checks that these manifests do not follow, each for a reason
SKIPPED_CHECKS = {
    "CKV_K8S_21": "the namespace is the user's (`kubectl apply -n NS`), not the file's",
    "CKV_K8S_43": "images are pinned by version tag (the vLLM release measured per GPU)",
    "CKV_K8S_15": "pull policy Always would fetch the multi-GB vLLM image at every restart",
    "CKV_K8S_38": "the gateway's token is needed: it watches the replicas' EndpointSlices",
}


def llama_fleet(tmp_path: Path, host: str = "127.0.0.1") -> Fleet:
    keys = [
        {"name": "alice", "sha256": key_hash("alice-key"), "tier": "free"},
        {"name": "bob", "sha256": key_hash("bob-key"), "tier": "pro"},
    ]
    (tmp_path / "keys.yaml").write_text(yaml.safe_dump({"keys": keys}))
    fleet = {
        "model": {"name": "Llama-3.1-70B", "path": "meta-llama/Llama-3.1-70B-Instruct"},
        "gpus": {"type": "H100-SXM", "count": 8},
        "vllm": {"max_model_len": 8192, "max_num_seqs": 64, "max_num_batched_tokens": 4096},
        "replicas": [
            {
                "name": f"llama-{i}",
                "tp": 4,
                "gpu_ids": [4 * i + g for g in range(4)],
                "port": 8001 + i,
            }
            for i in range(2)
        ],
        "gateway": {
            "host": host,
            "port": 8000,
            "auth": {"keys_file": "keys.yaml", "required": True},
            "rate_limit": {
                "requests_per_second": 1,
                "tiers": {"pro": {"requests_per_second": 20}},
            },
        },
    }
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(fleet))
    return load_fleet(tmp_path / "fleet.yaml")


def _containers(docs: list[dict]) -> list[tuple[str, dict, dict]]:
    """(workload name, pod spec, container) of every container."""
    return [
        (d["metadata"]["name"], d["spec"]["template"]["spec"], c)
        for d in docs
        if d["kind"] in ("Deployment", "StatefulSet")
        for c in d["spec"]["template"]["spec"]["containers"]
    ]


def test_k8s_export_of_a_llama_preset(tmp_path: Path) -> None:
    fleet = llama_fleet(tmp_path)
    text = k8s(fleet)
    docs = list(yaml.safe_load_all(text))
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    sts = by["StatefulSet", "llama-3-1-70b-tp4-default"]
    pod = sts["spec"]["template"]["spec"]
    engine = pod["containers"][0]
    # the gated repository's token: a Secret mounted as a file, required, never a value
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["hf-token"]["secret"] == {"secretName": "servefleet-hf-token", "optional": False}
    assert {"name": "HF_TOKEN_PATH", "value": "/etc/hf-token/token"} in engine["env"]
    assert "hf_" not in text.replace("hf_...", "")
    # the weights: a claim per pod that outlives it, sized from the model's bytes
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    size = int(claim["spec"]["resources"]["requests"]["storage"].removesuffix("Gi"))
    weights = load_model("Llama-3.1-70B").weight_bytes("auto") / 2**30  # ~131 GiB
    assert weights < size < 1.5 * weights
    assert "hf-cache" not in volumes  # not an emptyDir: the claim is mounted
    assert {"name": "hf-cache", "mountPath": "/data/hf-cache"} in engine["volumeMounts"]
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"]["whenScaled"] == "Retain"
    assert volumes["dshm"]["emptyDir"]["sizeLimit"] == "4Gi"  # bounded shared memory
    # only the gateway's pods reach the replicas and Redis
    policy = by["NetworkPolicy", "servefleet-replicas"]["spec"]
    assert policy["podSelector"] == {"matchLabels": {"servefleet/role": "replica"}}
    assert policy["ingress"] == [
        {"from": [{"podSelector": {"matchLabels": {"app": "servefleet-gateway"}}}],
         "ports": [{"port": "http"}]}
    ]  # fmt: skip
    assert sts["spec"]["template"]["metadata"]["labels"]["servefleet/role"] == "replica"
    assert (
        by["NetworkPolicy", "servefleet-redis"]["spec"]["ingress"][0]["from"]
        == policy["ingress"][0]["from"]
    )
    # every container: non-root, read-only root, no privilege escalation, requests = limits
    for name, spec, c in _containers(docs):
        sc = c["securityContext"]
        assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"], name
        assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        r = c["resources"]
        assert {"cpu", "memory"} <= r["requests"].keys() and r["requests"] == r["limits"], name
        # no secret reaches a container through its environment
        assert not any("valueFrom" in e for e in c.get("env", [])), name
        if name != "servefleet-gateway":  # only the gateway talks to the API server
            assert spec["automountServiceAccountToken"] is False, name
    # the keys file is a Secret mounted into the gateway, and its config points there
    gw = by["Deployment", "servefleet-gateway"]["spec"]["template"]["spec"]
    assert {"name": "keys", "secret": {"secretName": "servefleet-gateway-keys"}} in gw["volumes"]
    cfg = parse_config(
        yaml.safe_load(by["ConfigMap", "servefleet-gateway"]["data"]["gateway.yaml"])
    )
    assert cfg.auth.keys_file == "/etc/servefleet/keys/keys.yaml" and cfg.auth.required
    assert cfg.rate_limit.tiers["pro"].requests_per_second == 20
    assert cfg.rate_limit.redis_password_file == "/etc/servefleet/redis/password"
    assert str(tmp_path) not in by["ConfigMap", "servefleet-gateway"]["data"]["gateway.yaml"]
    # the header says which Secrets to create
    assert "servefleet-hf-token --from-literal=token=hf_..." in text
    assert f"servefleet-gateway-keys --from-file=keys.yaml={tmp_path / 'keys.yaml'}" in text


def test_k8s_weights_on_a_host_path_the_user_names(tmp_path: Path) -> None:
    (tmp_path / "fleet.yaml").write_text(dump_fleet(llama_fleet(tmp_path)))
    app = typer.Typer()
    register(app)
    args = ["export", "k8s", str(tmp_path / "fleet.yaml"), "--weights-host-path", "/mnt/models"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    docs = list(yaml.safe_load_all(r.output))
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    assert "volumeClaimTemplates" not in sts["spec"]
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert volumes["hf-cache"]["hostPath"]["path"] == "/mnt/models"


def _checkov(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(CHECKOV), "--framework", "kubernetes", "--quiet", "--compact", "--output", "json",
         "--skip-check", ",".join(SKIPPED_CHECKS), "--file", str(path)],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "BC_SKIP_MAPPING": "TRUE"},
    )  # fmt: skip


def _failed(p: subprocess.CompletedProcess) -> list[str]:
    report = json.loads(p.stdout)
    reports = report if isinstance(report, list) else [report]
    return [
        f"{c['check_id']} {c['resource']}"
        for rep in reports
        for c in rep.get("results", {}).get("failed_checks", [])
    ]


@pytest.mark.skipif(
    not CHECKOV.exists(), reason="checkov is installed by .ci/run into .venv-policy"
)
def test_k8s_export_passes_the_policy_linter(tmp_path: Path) -> None:
    out = tmp_path / "k8s.yaml"
    out.write_text(k8s(llama_fleet(tmp_path)))
    p = _checkov(out)
    assert p.returncode == 0 and _failed(p) == [], p.stdout[-4000:] + p.stderr[-2000:]
    # the linter is live: a container that may run as root fails it
    docs = list(yaml.safe_load_all(out.read_text()))
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    del sts["spec"]["template"]["spec"]["containers"][0]["securityContext"]
    out.write_text(yaml.safe_dump_all(docs))
    p = _checkov(out)
    assert p.returncode != 0 and any("CKV_K8S_20" in f for f in _failed(p)), p.stdout[-2000:]


def test_compose_publishes_only_the_gateway_port(tmp_path: Path) -> None:
    fleet = llama_fleet(tmp_path, host="10.1.2.3")
    doc = yaml.safe_load(compose(fleet))
    services = doc["services"]
    published = {name: s["ports"] for name, s in services.items() if "ports" in s}
    assert published == {"gateway": ["10.1.2.3:8000:8000"]}  # replicas and Redis: none
    for name, s in services.items():
        assert "ipc" not in s and s["security_opt"] == ["no-new-privileges:true"], name
        assert s["cap_drop"] == ["ALL"], name
        assert {"cpus", "memory"} <= s["deploy"]["resources"]["limits"].keys(), name
        # no directory of the host: the weights are in a named volume
        assert all(not v.startswith(("/", "~", ".")) for v in s.get("volumes", [])), name
    for name in ("gateway", "redis"):
        assert services[name]["read_only"] and services[name]["user"] == "10001:10001"
    replica = services["llama-0"]
    assert replica["volumes"] == ["hf-cache:/data/hf-cache"] and "hf-cache" in doc["volumes"]
    assert replica["env_file"] == [{"path": "hf-token.env", "required": True}]  # gated repo
    # secrets: the keys file and Redis's password, never in the compose file itself
    assert doc["secrets"] == {
        "gateway-keys": {"file": str(tmp_path / "keys.yaml")},
        "redis-password": {"environment": "SERVEFLEET_REDIS_PASSWORD"},
    }
    assert "--requirepass" in services["redis"]["command"][-1]
    cfg = parse_config(yaml.safe_load(doc["configs"]["gateway"]["content"]))
    assert cfg.auth.keys_file == "/run/secrets/gateway-keys"
    assert cfg.rate_limit.redis_password_file == "/run/secrets/redis-password"
    assert cfg.host == "0.0.0.0"  # inside its container; published on 10.1.2.3 only


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker CLI")
def test_compose_file_as_docker_compose_reads_it(tmp_path: Path) -> None:
    """`docker compose config` parses and resolves the file without a daemon, where the
    compose plugin is installed."""
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip("the docker CLI has no compose plugin")
    (tmp_path / "docker-compose.yaml").write_text(compose(llama_fleet(tmp_path)))
    (tmp_path / "hf-token.env").write_text("HF_TOKEN=hf_test\n")
    p = subprocess.run(
        ["docker", "compose", "-f", str(tmp_path / "docker-compose.yaml"), "config", "--quiet"],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "SERVEFLEET_REDIS_PASSWORD": "x"},
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
