"""``servefleet export compose``: the fleet of one host as a docker-compose file.

A service per replica (pinned to its GPUs), and the gateway with the same config `servefleet up`
gives it — fleet.yaml's `gateway:`, every replica by its own address, its pool and the cap per
replica — as an inline Compose config; with per-user rate limits, a Redis service (with a
password) holds the gateway's buckets (so that several gateways may share them).

Rule: only the gateway's port is published, on ``gateway.host``; replicas and Redis are reached
on the compose network alone. Secrets (the keys file, Redis's password, HF_TOKEN) come from
files or the environment, never the compose file; the weights live in a named volume."""

from __future__ import annotations

from servefleet.plan.fleet_yaml import Fleet

from .commands import gateway_config, needs_redis
from .export_common import (
    ADMIN_TOKEN_ENV,
    GATEWAY_CONFIG_PATH,
    HF_HOME,
    HF_TOKEN_ENV_FILE,
    NON_ROOT,
    dump_yaml,
    gateway_argv,
    hf_token,
    http_check,
    replica_container,
    replica_resources,
    slug,
    weight_bytes,
)
from .export_common import unique as unique_name
from .images import servefleet_image, vllm_image

REDIS_IMAGE = "redis:7.4"
REDIS_PASSWORD_ENV = "SERVEFLEET_REDIS_PASSWORD"
"""The variable `docker compose` reads Redis's password from (a compose secret)."""
WEIGHTS_VOLUME = "hf-cache"


def service_names(fleet: Fleet) -> dict[str, str]:
    """Replica name -> its Compose service name: distinct, never `gateway` or `redis`."""
    taken = {"gateway", "redis"}
    return {r.name: unique_name(slug(r.name) or "replica", taken) for r in fleet.replicas}


class ComposeError(ValueError):
    """A fleet that one compose file cannot run."""


def compose(fleet: Fleet, *, gateway_image: str | None = None) -> str:
    hosts = sorted({r.host for r in fleet.replicas})
    if len(hosts) > 1:
        raise ComposeError(
            f"fleet.yaml lists replicas on {len(hosts)} hosts ({', '.join(hosts)}); a compose "
            "file runs on one: run `servefleet up` on each host (docs/up.md), or use "
            "`servefleet export k8s`"
        )
    services: dict = {}
    secrets: dict = {}
    names = service_names(fleet)
    token = hf_token(fleet)
    weights = weight_bytes(fleet)
    for r in fleet.replicas:
        image, cmd = replica_container(fleet, r, r.port, gateway_image)
        # no `ports`: a replica is reached on the compose network only, through the gateway
        svc: dict = {
            "image": image,
            "command": cmd,
            "restart": "unless-stopped",
            "healthcheck": {
                "test": http_check(r.port, "/health"),
                "interval": "10s",
                "timeout": "5s",
                "retries": 3,
                "start_period": "600s",
            },
            "security_opt": ["no-new-privileges:true"],
            "cap_drop": ["ALL"],
        }
        res = replica_resources(fleet, r)
        limits = {"cpus": f"{res.cpus:g}", "memory": f"{res.memory_gib}g"}
        if fleet.engine == "vllm":
            svc["shm_size"] = f"{res.shm_gib}g"  # NCCL between TP ranks, not the host's IPC
            svc["environment"] = {"HF_HOME": HF_HOME}
            svc["volumes"] = [f"{WEIGHTS_VOLUME}:{HF_HOME}"]  # the weights survive a restart
            if token is not None:
                svc["env_file"] = [{"path": HF_TOKEN_ENV_FILE, "required": token.required}]
            svc["deploy"] = {
                "resources": {
                    "limits": limits,
                    "reservations": {
                        "devices": [
                            {
                                "driver": "nvidia",
                                "device_ids": [str(g) for g in r.gpu_ids],
                                "capabilities": ["gpu"],
                            }
                        ]
                    },
                }
            }
        else:
            svc["read_only"] = True
            svc["user"] = NON_ROOT
            svc["deploy"] = {"resources": {"limits": limits}}
        services[names[r.name]] = svc
    g = fleet.gateway
    redis_url = (
        "redis://redis:6379/0" if needs_redis(fleet) and g.rate_limit.redis_url is None else None
    )
    cfg = gateway_config(
        fleet, url_of=lambda r: f"http://{names[r.name]}:{r.port}", redis_url=redis_url
    )
    cfg["host"] = "0.0.0.0"  # inside its container; published on gateway.host only
    cfg.pop("admin_token", None)  # from the environment, never a config file
    gateway_secrets = []
    if g.auth.keys_file is not None:
        secrets["gateway-keys"] = {"file": g.auth.keys_file}
        gateway_secrets.append("gateway-keys")
        cfg["auth"]["keys_file"] = "/run/secrets/gateway-keys"
    # the gateway starts at once: its /ready says which replicas are still loading
    depends = {names[r.name]: {"condition": "service_started"} for r in fleet.replicas}
    if redis_url:
        secrets["redis-password"] = {"environment": REDIS_PASSWORD_ENV}
        gateway_secrets.append("redis-password")
        cfg["rate_limit"]["redis_password_file"] = "/run/secrets/redis-password"
        services["redis"] = {
            "image": REDIS_IMAGE,
            "command": [
                "sh",
                "-c",
                'exec redis-server --save "" --appendonly no '
                '--requirepass "$$(cat /run/secrets/redis-password)"',
            ],
            "secrets": ["redis-password"],
            "restart": "unless-stopped",
            "read_only": True,
            "user": NON_ROOT,
            "security_opt": ["no-new-privileges:true"],
            "cap_drop": ["ALL"],
            "deploy": {"resources": {"limits": {"cpus": "1", "memory": "512m"}}},
        }
        depends["redis"] = {"condition": "service_started"}
    services["gateway"] = {
        "image": gateway_image or servefleet_image(),
        "command": gateway_argv(),
        "configs": [{"source": "gateway", "target": GATEWAY_CONFIG_PATH}],
        # beyond loopback /fleet and /metrics need the admin token; unset, they answer 403
        "environment": {ADMIN_TOKEN_ENV: f"${{{ADMIN_TOKEN_ENV}:-}}"},
        # the one published port, on the address fleet.yaml names (gateway.host)
        "ports": [f"{_published_host(g.host)}:{g.port}:{g.port}"],
        "restart": "unless-stopped",
        "depends_on": depends,
        "healthcheck": {
            "test": http_check(g.port, "/ready"),
            "interval": "5s",
            "timeout": "3s",
            "retries": 3,
        },
        "read_only": True,
        "user": NON_ROOT,
        "security_opt": ["no-new-privileges:true"],
        "cap_drop": ["ALL"],
        "deploy": {"resources": {"limits": {"cpus": "2", "memory": "1g"}}},
    }
    if gateway_secrets:
        services["gateway"]["secrets"] = gateway_secrets
    doc: dict = {
        "services": services,
        "configs": {"gateway": {"content": dump_yaml(cfg)}},
    }
    if secrets:
        doc["secrets"] = secrets
    if fleet.engine == "vllm":
        doc["volumes"] = {WEIGHTS_VOLUME: {}}
    head = "# docker-compose.yaml — generated by `servefleet export compose` from fleet.yaml\n"
    if fleet.engine == "vllm":
        image, why = vllm_image(fleet.gpus.type)
        head += f"# vLLM image {image}: {why}\n"
        head += f"# weights: ~{weights / 2**30:.0f} GiB in the volume {WEIGHTS_VOLUME}\n"
    if token is not None:
        head += f"# {HF_TOKEN_ENV_FILE}: HF_TOKEN=hf_... ({token.why}); keep it out of version control\n"
    if redis_url:
        head += f"# Redis's password: export {REDIS_PASSWORD_ENV}=$(openssl rand -hex 24)\n"
    return head + dump_yaml(doc)


def _published_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
