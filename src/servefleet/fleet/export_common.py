"""What the exporters share: object names, each replica's container command, health checks."""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass

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


HF_HOME = "/data/hf-cache"
"""Where a replica's container keeps the Hugging Face cache (the weights): a volume that
outlives the container (compose: a named volume; Kubernetes: a PersistentVolumeClaim)."""
HF_TOKEN_ENV_FILE = "hf-token.env"
"""compose: the env file (next to the compose file) that holds ``HF_TOKEN=hf_...``."""
NON_ROOT = "10001:10001"
"""The user the gateway, Redis and sim-server containers run as (the servefleet image's own)."""
GATED_ORGS = frozenset({"meta-llama", "mistralai", "google"})
"""Hugging Face organisations whose repositories need an accepted licence, hence a token."""


@dataclass(frozen=True)
class HfToken:
    required: bool
    """True: the repository is gated (``GATED_ORGS``), the replicas cannot load without it."""
    why: str


def hf_token(fleet: Fleet) -> HfToken | None:
    """Whether the replicas need ``HF_TOKEN``. Rule: a repository of ``GATED_ORGS`` requires
    it; any other Hugging Face repository id (``org/name``) may use it (a private repository);
    a local directory, or sim-server replicas, never."""
    if fleet.engine != "vllm":
        return None
    path = fleet.model.path
    if path.startswith(("/", ".", "~")) or path.count("/") != 1:
        return None
    org = path.split("/", 1)[0]
    if org in GATED_ORGS:
        return HfToken(True, f"{path} is a gated repository: accept its licence, then a token")
    return HfToken(False, f"optional: only if {path} is private")


WEIGHTS_FALLBACK_BYTES = 100 * 2**30
"""Weights of a model the catalog cannot size (a config.json it cannot read)."""


def weight_bytes(fleet: Fleet) -> int:
    """Bytes of the checkpoint the replicas download (its own dtype)."""
    from servefleet.models import load_model

    try:
        return load_model(fleet.model.name).weight_bytes("auto")
    except (ValueError, OSError):
        return WEIGHTS_FALLBACK_BYTES


def weights_volume_gib(fleet: Fleet) -> int:
    """The weights volume's size: the checkpoint + 25 % (tokenizer, config, a partial download
    beside a whole one), at least 10 GiB."""
    return max(10, math.ceil(weight_bytes(fleet) * 1.25 / 2**30))


@dataclass(frozen=True)
class Resources:
    cpus: float
    memory_gib: int
    shm_gib: int


def replica_resources(fleet: Fleet, r: Replica) -> Resources:
    """What one replica's container is given. Rule: vLLM, 4 CPUs per GPU (a tokenizer and
    a scheduler process per rank) and host memory for its share of the weights (loaded through
    host memory) + 16 GiB; shared memory 1 GiB per GPU for NCCL between TP ranks. A sim-server
    replica: 1 CPU, 2 GiB."""
    if fleet.engine != "vllm":
        return Resources(1.0, 2, 1)
    share = math.ceil(weight_bytes(fleet) / r.tp / 2**30)
    return Resources(4.0 * r.tp, share + 16, r.tp)


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
