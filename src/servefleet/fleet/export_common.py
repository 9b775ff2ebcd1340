"""What the exporters share: object names, each replica's container command, health checks."""

from __future__ import annotations

import re
import shlex

import yaml

from servefleet.plan.fleet_yaml import Fleet, Replica

from .commands import SimOptions, sim_spec
from .images import servefleet_image, vllm_image

CONTAINER_PORT = 8000
"""The port every replica listens on inside its container or pod (each has its own address)."""
GATEWAY_CONFIG_PATH = "/etc/servefleet/gateway.yaml"


def slug(name: str) -> str:
    """Lowercase ASCII letters, digits and single dashes: what a Compose service name
    (`^[a-zA-Z0-9._-]+$`) and a Kubernetes object name accept. May be empty."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def unique(base: str, taken: set[str], suffix: str = "", limit: int = 63) -> str:
    """`base + suffix`, or with `-2`, `-3`, ... after it if taken; `base` cut so that the name
    has at most `limit` characters; the name is added to `taken`."""
    i, end = 1, suffix
    while True:
        name = base[: limit - len(end)].strip("-") + end
        if name not in taken:
            taken.add(name)
            return name
        i += 1
        end = f"{suffix}-{i}"


ADMIN_TOKEN_ENV = "SERVEFLEET_ADMIN_TOKEN"
"""The environment variable the gateway reads its admin token from (never a config file)."""


def gateway_argv(config_path: str = GATEWAY_CONFIG_PATH) -> list[str]:
    """The gateway's command in a container: everything else is in its config file."""
    return ["servefleet", "gateway", "--config", config_path]


def _vllm_args(fleet: Fleet, r: Replica) -> list[str]:
    parts = shlex.split(fleet.serve_command(r))
    parts = [p for p in parts if not p.startswith("CUDA_VISIBLE_DEVICES=")]
    return parts[2:]  # after `vllm serve`: the model and the flags


def _set_flag(argv: list[str], flag: str, value: str) -> list[str]:
    out = list(argv)
    if flag in out:
        out[out.index(flag) + 1] = value
    else:
        out += [flag, value]
    return out


def replica_container(
    fleet: Fleet, r: Replica, port: int, own_image: str | None = None
) -> tuple[str, list[str]]:
    """(image, command) of one replica's container, listening on every interface at `port`.
    For vLLM the command is the arguments of the image's entrypoint (`vllm serve`); sim-server
    replicas run in servefleet's image (`own_image`, default ``servefleet:<version>``)."""
    if fleet.engine == "vllm":
        image, _ = vllm_image(fleet.gpus.type)
        args = _set_flag(_vllm_args(fleet, r), "--port", str(port))
        return image, [*args, "--host", "0.0.0.0"]
    argv = sim_spec(fleet, r, SimOptions()).argv
    argv = ["servefleet", "sim-server", *argv[3:]]
    argv = _set_flag(_set_flag(argv, "--host", "0.0.0.0"), "--port", str(port))
    return own_image or servefleet_image(), argv


def http_check(port: int, path: str) -> list[str]:
    """A container health check that needs only Python (the servefleet image has no curl; the
    vLLM image has Python too): exit 0 when `GET path` answers 200."""
    code = (
        "import sys,urllib.request as u;"
        f"sys.exit(0 if u.urlopen('http://127.0.0.1:{port}{path}',timeout=4).status==200 else 1)"
    )
    return ["CMD", "python3", "-c", code]


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data) -> bool:  # no &id001 anchors: each object written out
        return True


def dump_yaml(doc: dict) -> str:
    return yaml.dump(doc, Dumper=_Dumper, sort_keys=False)


def dump_yaml_all(docs: list[dict]) -> str:
    return yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False)
