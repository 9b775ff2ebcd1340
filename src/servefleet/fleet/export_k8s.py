"""``servefleet export k8s``: Kubernetes as the multi-host engine (docs/export.md).

Per replica group (replicas of one TP and pool) a StatefulSet and a headless Service: every
replica is a pod of its own, addressable (``<pod>.<service>``), with a stable name. The gateway
finds the pods from the Service's EndpointSlices (gateway/discovery.py) and keeps what it does
for `servefleet up`: per-replica routing, health checks, the cap per replica. Several gateway
pods share the per-user rate limits through a Redis Deployment.

Rule for ``--hosts N``: a fleet.yaml whose replicas are all on one host describes one node of
``gpus.count`` GPUs; the export runs N such nodes (each group N times as many replicas). A
fleet.yaml that already lists replicas on several hosts is taken whole (N must be its count
of hosts).

Rule for the cap with several gateways: each gateway pod admits ``max_in_flight_per_replica //
gateways`` (at least 1) to a replica, so that a replica never holds more than the cap.
"""

from __future__ import annotations

import math

from servefleet.plan.fleet_yaml import Fleet, Replica

from .commands import gateway_config, needs_redis, replica_entry
from .export_common import (
    CONTAINER_PORT,
    GATEWAY_CONFIG_PATH,
    HF_HOME,
    dump_yaml,
    dump_yaml_all,
    gateway_argv,
    hf_token,
    replica_container,
    replica_resources,
    slug,
    unique,
    weights_volume_gib,
)
from .export_compose import REDIS_IMAGE
from .images import servefleet_image, vllm_image

GATEWAY = "servefleet-gateway"
REDIS = "servefleet-redis"
HF_SECRET = "servefleet-hf-token"
"""The Secret (key ``token``) with the Hugging Face token: ``kubectl create secret generic
servefleet-hf-token --from-literal=token=hf_...``; mounted as a file (``HF_TOKEN_PATH``)."""
KEYS_SECRET = "servefleet-gateway-keys"
"""The Secret (key ``keys.yaml``) with the gateway's API keys file (``auth.keys_file``)."""
REDIS_SECRET = "servefleet-redis"
"""The Secret (key ``password``) with Redis's password."""
UID = 10001
"""The user every container runs as (the servefleet image's; vLLM's image runs as any)."""
ADMIN_SECRET = "servefleet-gateway-admin"
"""The Secret (key ``token``) that enables the gateway's /fleet, /metrics and /admin/*:
``kubectl create secret generic servefleet-gateway-admin --from-literal=token=$(openssl rand -hex 24)``."""
STARTUP_PERIOD_S = 10
MIN_STARTUP_BUDGET_S = 1800
"""Model loading: the predicted start-up is for weights on local disk; downloading them first
(28 GB for a 14B model in fp16) takes minutes more."""

GPU_PRODUCT = {
    "V100-SXM2-32G": "Tesla-V100-SXM2-32GB",
    "V100-PCIE-32G": "Tesla-V100-PCIE-32GB",
    "V100-16G": "Tesla-V100-SXM2-16GB",
    "T4": "Tesla-T4",
    "A10": "NVIDIA-A10",
    "A100-40G-SXM": "NVIDIA-A100-SXM4-40GB",
    "A100-80G-SXM": "NVIDIA-A100-SXM4-80GB",
    "L40S": "NVIDIA-L40S",
    "RTX-4090": "NVIDIA-GeForce-RTX-4090",
    "H100-SXM": "NVIDIA-H100-80GB-HBM3",
    "H200-SXM": "NVIDIA-H200",
}
"""The ``nvidia.com/gpu.product`` label NVIDIA's GPU Feature Discovery gives a node: the CUDA
device name with dashes for spaces (the H200's, "NVIDIA H200", as seen on the measured one)."""
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"


def gpu_product(gpu: str) -> str | None:
    from servefleet.hardware import UnknownGPUError, get_gpu

    try:
        return GPU_PRODUCT.get(get_gpu(gpu).name)
    except UnknownGPUError:
        return None


class HostsError(ValueError):
    """``--hosts`` that does not fit the fleet.yaml."""


def host_count(fleet: Fleet, hosts: int | None) -> tuple[int, int]:
    """(nodes, multiplier of the fleet.yaml's replicas) for ``--hosts``."""
    listed = len({r.host for r in fleet.replicas})
    if hosts is None:
        return listed, 1
    if hosts < 1:
        raise HostsError(f"--hosts must be >= 1, got {hosts}")
    if listed == 1:
        return hosts, hosts
    if hosts != listed:
        raise HostsError(
            f"fleet.yaml lists replicas on {listed} hosts; --hosts {hosts} does not match "
            "(give a one-host fleet.yaml to repeat it on N nodes)"
        )
    return hosts, 1


def _startup_budget(fleet: Fleet, tp: int) -> int:
    """Seconds the startup probe allows: 3 x the predicted first start, at least 30 min."""
    from servefleet.hardware import get_gpu
    from servefleet.models import load_model
    from servefleet.sim.deployment import resolve_deployment
    from servefleet.sim.server.startup import predicted_startup_seconds

    v = fleet.vllm
    try:
        dep = resolve_deployment(
            load_model(fleet.model.name), get_gpu(fleet.gpus.type), tp=tp, replicas=1,
            dtype=v.dtype, max_model_len=v.max_model_len, max_num_seqs=v.max_num_seqs,
            max_num_batched_tokens=v.max_num_batched_tokens,
            gpu_memory_utilization=v.gpu_memory_utilization, block_size=v.block_size,
            enable_prefix_caching=v.enable_prefix_caching, enforce_eager=v.enforce_eager,
        )  # fmt: skip
        predicted = predicted_startup_seconds(dep)
    except (ValueError, OSError):  # a model or GPU the catalog cannot resolve
        predicted = 0.0
    return max(MIN_STARTUP_BUDGET_S, math.ceil(3 * predicted))


def _probe(path: str, period: int, failures: int) -> dict:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "failureThreshold": failures,
    }


def _restricted(read_only: bool = True) -> dict:
    """A container's securityContext: no root, no privilege escalation, no capabilities."""
    return {
        "runAsNonRoot": True,
        "runAsUser": UID,
        "runAsGroup": UID,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": read_only,
        "capabilities": {"drop": ["ALL"]},
    }


POD_SECURITY = {"runAsNonRoot": True, "fsGroup": UID, "seccompProfile": {"type": "RuntimeDefault"}}


def _resources(cpus: float, memory_gib: float, extra: dict | None = None) -> dict:
    amount = {"cpu": f"{cpus:g}", "memory": f"{memory_gib:g}Gi", **(extra or {})}
    return {"requests": dict(amount), "limits": dict(amount)}


def _replica_pod(
    fleet: Fleet, r: Replica, labels: dict, own_image: str | None, weights: str | None
) -> tuple[dict, list[dict]]:
    """(pod template, volumeClaimTemplates) of a replica group."""
    image, args = replica_container(fleet, r, CONTAINER_PORT, own_image)
    budget = _startup_budget(fleet, r.tp)
    res = replica_resources(fleet, r)
    container: dict = {
        "name": "engine",
        "image": image,
        "args": args,
        "ports": [{"containerPort": CONTAINER_PORT, "name": "http"}],
        # model loading: no other probe runs before this one passes
        "startupProbe": _probe("/health", STARTUP_PERIOD_S, math.ceil(budget / STARTUP_PERIOD_S)),
        "readinessProbe": _probe("/health", 5, 3),
        "livenessProbe": _probe("/health", 15, 4),
        "securityContext": _restricted(),
        "resources": _resources(res.cpus, res.memory_gib),
        # caches (compiled kernels, CUDA graphs) in a scratch volume: the root stays read-only
        "env": [{"name": "HOME", "value": "/tmp"}],
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    spec: dict = {
        "containers": [container],
        "terminationGracePeriodSeconds": 60,
        "automountServiceAccountToken": False,  # a replica never talks to the API server
        "securityContext": POD_SECURITY,
        "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "16Gi"}}],
    }
    claims: list[dict] = []
    if fleet.engine == "vllm":
        container["resources"] = _resources(res.cpus, res.memory_gib, {"nvidia.com/gpu": r.tp})
        container["env"].append({"name": "HF_HOME", "value": HF_HOME})
        container["volumeMounts"] += [
            {"name": "dshm", "mountPath": "/dev/shm"},  # NCCL between TP ranks
            {"name": "hf-cache", "mountPath": HF_HOME},
        ]
        spec["volumes"].append(
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{res.shm_gib}Gi"}}
        )
        if weights is not None:  # a directory of each node the user names
            spec["volumes"].append(
                {"name": "hf-cache", "hostPath": {"path": weights, "type": "DirectoryOrCreate"}}
            )
        else:  # a volume per pod that outlives it: a restart does not download them again
            claims.append(
                {
                    "metadata": {"name": "hf-cache"},
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": f"{weights_volume_gib(fleet)}Gi"}},
                    },
                }
            )
        if (token := hf_token(fleet)) is not None:
            container["env"].append({"name": "HF_TOKEN_PATH", "value": "/etc/hf-token/token"})
            container["volumeMounts"].append(
                {"name": "hf-token", "mountPath": "/etc/hf-token", "readOnly": True}
            )
            spec["volumes"].append(
                {
                    "name": "hf-token",
                    "secret": {"secretName": HF_SECRET, "optional": not token.required},
                }
            )
        if product := gpu_product(fleet.gpus.type):
            spec["nodeSelector"] = {GPU_PRODUCT_LABEL: product}
        spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists",
                                "effect": "NoSchedule"}]  # fmt: skip
    spec["topologySpreadConstraints"] = [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"app": labels["app"]}},
        }
    ]
    return {"metadata": {"labels": labels}, "spec": spec}, claims


def _gateway_config(fleet: Fleet, sources: list[dict]) -> dict:
    # health: the gateway's defaults (`up`'s fast checks are for one machine)
    cfg = gateway_config(fleet, health_interval=None, redis_url=f"redis://{REDIS}:6379/0")
    cfg["host"] = "0.0.0.0"
    cfg["replicas"] = []
    cfg["discovery"] = {"kubernetes": {"services": sources}}
    cfg.pop("admin_token", None)  # from a Secret, never the ConfigMap
    cfg["admin_token_file"] = f"{ADMIN_DIR}/token"
    if fleet.gateway.auth.keys_file is not None:
        cfg["auth"]["keys_file"] = f"{KEYS_DIR}/keys.yaml"
    if _own_redis(fleet):
        cfg["rate_limit"]["redis_password_file"] = f"{REDIS_PASSWORD_DIR}/password"
    return cfg


KEYS_DIR = "/etc/servefleet/keys"
ADMIN_DIR = "/etc/servefleet/admin"
REDIS_PASSWORD_DIR = "/etc/servefleet/redis"


REDIS_COMMAND = (
    'exec redis-server --save "" --appendonly no '
    f'--requirepass "$(cat {REDIS_PASSWORD_DIR}/password)"'
)
"""Redis with its password from the Secret's file (never an environment variable)."""


def _own_redis(fleet: Fleet) -> bool:
    """A Redis Deployment of the export's own: the gateway needs one and names none."""
    return needs_redis(fleet) and fleet.gateway.rate_limit.redis_url is None


def secrets_to_create(fleet: Fleet) -> list[str]:
    """The Secrets the manifests refer to and the user creates (never written in them)."""
    out = [
        "Secrets to create first (kubectl create secret generic NAME ...):",
        f"  {ADMIN_SECRET} --from-literal=token=$(openssl rand -hex 24)   "
        "(optional: /fleet, /metrics, /admin)",
    ]
    if (token := hf_token(fleet)) is not None:
        need = "required" if token.required else "optional"
        out.append(f"  {HF_SECRET} --from-literal=token=hf_...   ({need}: {token.why})")
    if fleet.gateway.auth.keys_file is not None:
        out.append(f"  {KEYS_SECRET} --from-file=keys.yaml={fleet.gateway.auth.keys_file}")
    if _own_redis(fleet):
        out.append(f"  {REDIS_SECRET} --from-literal=password=$(openssl rand -hex 24)")
    return out


def _network_policies(fleet: Fleet) -> list[dict]:
    """Replicas (and Redis) admit the gateway's pods only: a client cannot reach around the
    gateway's keys, caps and limits."""
    gateway_pods = [{"podSelector": {"matchLabels": {"app": GATEWAY}}}]

    def admit_gateway(name: str, selector: dict, port: str) -> dict:
        return {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": name},
            "spec": {
                "podSelector": {"matchLabels": selector},
                "policyTypes": ["Ingress"],
                "ingress": [{"from": gateway_pods, "ports": [{"port": port}]}],
            },
        }

    docs = [
        {  # the gateway: its port, from anywhere (narrow `from` to your clients if you can)
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": GATEWAY},
            "spec": {
                "podSelector": {"matchLabels": {"app": GATEWAY}},
                "policyTypes": ["Ingress"],
                "ingress": [{"ports": [{"port": "http"}]}],
            },
        },
        admit_gateway("servefleet-replicas", {"servefleet/role": "replica"}, "http"),
    ]
    if _own_redis(fleet):
        docs.append(admit_gateway(REDIS, {"app": REDIS}, "redis"))
    return docs


def _per_gateway_cap(cap: int | None, gateways: int) -> int | None:
    return None if cap is None else max(1, cap // gateways)


def _redis_docs() -> list[dict]:
    labels = {"app": REDIS}
    redis_password_mount = {"name": "password", "mountPath": REDIS_PASSWORD_DIR, "readOnly": True}
    return [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": REDIS, "labels": labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "automountServiceAccountToken": False,
                        "securityContext": POD_SECURITY,
                        "containers": [
                            {
                                "name": "redis",
                                "image": REDIS_IMAGE,
                                # buckets live seconds: nothing to persist
                                "command": ["sh", "-c", REDIS_COMMAND],
                                "volumeMounts": [redis_password_mount],
                                "ports": [{"containerPort": 6379, "name": "redis"}],
                                "readinessProbe": {
                                    "tcpSocket": {"port": "redis"},
                                    "periodSeconds": 5,
                                },
                                "livenessProbe": {
                                    "tcpSocket": {"port": "redis"},
                                    "periodSeconds": 10,
                                },
                                "securityContext": _restricted(),
                                "resources": _resources(1, 0.5),
                            }
                        ],
                        "volumes": [{"name": "password", "secret": {"secretName": REDIS_SECRET}}],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": REDIS, "labels": labels},
            "spec": {
                "selector": labels,
                "ports": [{"name": "redis", "port": 6379, "targetPort": "redis"}],
            },
        },
    ]


def _rbac_docs() -> list[dict]:
    """The gateway's identity: it may read EndpointSlices of its namespace, nothing else."""
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": GATEWAY}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": GATEWAY},
            "rules": [
                {
                    "apiGroups": ["discovery.k8s.io"],
                    "resources": ["endpointslices"],
                    "verbs": ["get", "list", "watch"],
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": GATEWAY},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": GATEWAY},
            "subjects": [{"kind": "ServiceAccount", "name": GATEWAY}],
        },
    ]


def _gateway_docs(fleet: Fleet, cfg: dict, gateways: int, image: str) -> list[dict]:
    labels = {"app": GATEWAY}
    port = fleet.gateway.port
    container = {
        "name": "gateway",
        "image": image,
        "args": gateway_argv(),
        "ports": [{"containerPort": port, "name": "http"}],
        "readinessProbe": _probe("/ready", 5, 3),
        "livenessProbe": _probe("/health", 10, 3),
        "resources": _resources(2, 1),
        "volumeMounts": [
            {"name": "config", "mountPath": GATEWAY_CONFIG_PATH.rsplit("/", 1)[0]},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
        "securityContext": _restricted(),
    }
    volumes: list[dict] = [
        {"name": "config", "configMap": {"name": GATEWAY}},
        {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
        # beyond loopback /fleet and /metrics need the admin token (docs/gateway.md); without
        # the Secret (optional) they answer 403 naming the fix
        {"name": "admin", "secret": {"secretName": ADMIN_SECRET, "optional": True}},
    ]
    mounts = container["volumeMounts"]
    mounts.append({"name": "admin", "mountPath": ADMIN_DIR, "readOnly": True})
    if fleet.gateway.auth.keys_file is not None:
        volumes.append({"name": "keys", "secret": {"secretName": KEYS_SECRET}})
        mounts.append({"name": "keys", "mountPath": KEYS_DIR, "readOnly": True})
    if _own_redis(fleet):
        volumes.append({"name": "redis-password", "secret": {"secretName": REDIS_SECRET}})
        mounts.append({"name": "redis-password", "mountPath": REDIS_PASSWORD_DIR,
                       "readOnly": True})  # fmt: skip
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": GATEWAY},
            "data": {GATEWAY_CONFIG_PATH.rsplit("/", 1)[1]: dump_yaml(cfg)},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": GATEWAY, "labels": labels},
            "spec": {
                "replicas": gateways,  # stateless: rate limits in Redis, replicas discovered
                "selector": {"matchLabels": labels},
                "strategy": {"rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": GATEWAY,  # reads EndpointSlices (discovery)
                        "securityContext": POD_SECURITY,
                        "containers": [container],
                        "volumes": volumes,
                        "terminationGracePeriodSeconds": 45,  # drain_timeout 30 s, then exit
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": GATEWAY, "labels": labels},
            "spec": {
                "selector": labels,
                "ports": [{"name": "http", "port": port, "targetPort": "http"}],
            },
        },
    ]


def k8s(
    fleet: Fleet,
    *,
    hosts: int | None = None,
    gateways: int = 2,
    gateway_image: str | None = None,
    weights_host_path: str | None = None,
    storage_class: str | None = None,
) -> str:
    """Every manifest, in the order `kubectl apply -f` should create them. The weights go on a
    PersistentVolumeClaim per replica pod (of ``storage_class``, default the cluster's), or in
    ``weights_host_path`` of each node."""
    nodes, times = host_count(fleet, hosts)
    if gateways < 1:
        raise ValueError(f"--gateways must be >= 1, got {gateways}")
    groups: dict[tuple[int, str], list[Replica]] = {}
    for r in fleet.replicas:
        groups.setdefault((r.tp, r.pool), []).append(r)
    base = slug(fleet.model.name) or "model"
    if not base[0].isalpha():  # a Service name is a DNS-1035 label: it starts with a letter
        base = f"m-{base}"
    taken = {GATEWAY, REDIS}
    replica_docs: list[dict] = []
    sources: list[dict] = []
    cap = _per_gateway_cap(fleet.gateway.max_in_flight_per_replica, gateways)
    for (tp, pool), reps in groups.items():
        name = unique(base, taken, suffix=f"-tp{tp}-{slug(pool)[:20].rstrip('-') or 'pool'}")
        labels = {"app": name, "servefleet/role": "replica"}
        replica_docs.append(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": name, "labels": labels},
                "spec": {
                    "clusterIP": "None",  # headless: a DNS name and an endpoint per pod
                    "selector": {"app": name},
                    "ports": [{"name": "http", "port": CONTAINER_PORT, "targetPort": "http"}],
                },
            }
        )
        template, claims = _replica_pod(fleet, reps[0], labels, gateway_image, weights_host_path)
        sts: dict = {
            "serviceName": name,
            "replicas": len(reps) * times,
            "podManagementPolicy": "Parallel",  # load every model at once
            "selector": {"matchLabels": {"app": name}},
            "template": template,
        }
        if claims:
            if storage_class:
                claims[0]["spec"]["storageClassName"] = storage_class
            sts["volumeClaimTemplates"] = claims
            # scaled down or deleted, the claims stay: the weights are there for the next pod
            sts["persistentVolumeClaimRetentionPolicy"] = {
                "whenDeleted": "Retain",
                "whenScaled": "Retain",
            }
        replica_docs.append(
            {
                "apiVersion": "apps/v1",
                "kind": "StatefulSet",
                "metadata": {"name": name, "labels": labels},
                "spec": sts,
            }
        )
        entry = replica_entry(fleet, reps[0], "http://discovered", cap)
        sources.append(
            {
                "service": name,
                "port": "http",
                "replica": {k: v for k, v in entry.items() if k not in ("url", "name")},
            }
        )
    docs = [*_rbac_docs()]
    if _own_redis(fleet):
        docs += _redis_docs()
    docs += replica_docs
    cfg = _gateway_config(fleet, sources)
    docs += _gateway_docs(fleet, cfg, gateways, gateway_image or servefleet_image())
    docs += _network_policies(fleet)
    head = [
        "# Kubernetes manifests — generated by `servefleet export k8s` from fleet.yaml",
        f"# {nodes} node(s) of {fleet.gpus.count} x {fleet.gpus.type}; "
        f"{sum(len(r) for r in groups.values()) * times} replica(s); {gateways} gateway pod(s)"
        + (f", each admitting {cap} request(s) at once per replica" if cap else ""),
    ]
    if fleet.engine == "vllm":
        image, why = vllm_image(fleet.gpus.type)
        head.append(f"# vLLM image {image}: {why}")
        if gpu_product(fleet.gpus.type) is None:
            head.append(f"# no nodeSelector: {fleet.gpus.type} has no known {GPU_PRODUCT_LABEL}")
        where = weights_host_path or f"a {weights_volume_gib(fleet)} GiB claim per replica pod"
        head.append(f"# weights: {where}")
    head += [f"# {line}" for line in secrets_to_create(fleet)]
    return "\n".join(head) + "\n" + dump_yaml_all(docs)
