"""``fleet.yaml``: what ``servefleet up`` starts — the schema, validated with pydantic.

```yaml
version: 1
model:   {name: Qwen1.5-14B, path: Qwen/Qwen1.5-14B-Chat, trust_remote_code: false}
engine:  vllm                       # vllm: real `vllm serve` processes; sim: simulated replicas
gpus:    {type: V100-SXM2-32G, count: 8}   # per host
vllm:                               # flags shared by every replica (vLLM's names, without --)
  dtype: half
  max_model_len: 4096
  max_num_seqs: 32
  max_num_batched_tokens: 512
  gpu_memory_utilization: 0.9
  block_size: 16
  enable_prefix_caching: false
  enforce_eager: false
  quantization: null
  extra_args: []
replicas:                           # one entry per `vllm serve` process
  - {name: replica-0, host: localhost, tp: 2, gpu_ids: [0, 1], port: 8001, pool: default}
gateway:                            # the gateway's own configuration (docs/gateway.md)
  host: 127.0.0.1
  port: 8000
  policy: least-outstanding
  max_in_flight_per_replica: 48
  # optional: API keys and per-key limits by tier
  # auth: {keys_file: keys.yaml, required: true}    # relative to this file
  # rate_limit: {requests_per_second: 2, request_burst: 10, tiers: {pro: {requests_per_second: 20}}}
```

Rules checked here: a replica has exactly ``tp`` GPU ids, each below ``gpus.count``; names are
unique; no two processes of a host share a port (the gateway runs on ``localhost``). Several
replicas may share a GPU (small models on big GPUs) only when their memory shares fit:
replicas on one GPU × ``vllm.gpu_memory_utilization`` must not exceed 1 (vLLM's fraction is of
the whole GPU's memory, per process). Replicas that share GPUs must share all of them (the same
``gpu_ids``), so that a GPU's time is split evenly among the replicas on it.
"""

from __future__ import annotations

import shlex
from collections import Counter
from itertools import pairwise
from pathlib import Path
from typing import Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    ValidationError,
    model_validator,
)

from servefleet.gateway.config import ConfigError, GatewayConfig
from servefleet.gateway.identity import load_keys
from servefleet.sim.resend import EXACT, RANDOM_WEIGHTS
from servefleet.yaml_lines import compose, line_of, syntax_error


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelRef(_Model):
    name: str
    """The servefleet model (a preset or a config.json path): what the simulator loads."""
    path: str
    """What `vllm serve` loads: a Hugging Face repository id or a local directory."""
    trust_remote_code: bool = False


class GPUs(_Model):
    type: str
    """A GPU of the catalog (`servefleet gpus`)."""
    count: PositiveInt
    """GPUs per host."""
    file: str | None = None
    """A GPU YAML file (docs/hardware.md) that defines ``type`` when the catalog does not."""

    @model_validator(mode="after")
    def _in_catalog(self):
        from servefleet.hardware import GPUCatalog

        catalog = GPUCatalog.builtin()
        if self.file is not None:
            catalog = catalog.with_yaml(self.file)
        try:
            catalog.get(self.type)
        except ValueError as e:  # "did you mean", and the catalog's names
            raise ValueError(f"type: {e}") from None
        return self


class VLLMFlags(_Model):
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = "auto"
    """vLLM ``--dtype`` (its choices)."""
    max_model_len: PositiveInt
    max_num_seqs: PositiveInt
    max_num_batched_tokens: PositiveInt
    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0)
    block_size: PositiveInt = 16
    enable_prefix_caching: bool = True
    enforce_eager: bool = False
    quantization: str | None = None
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = "auto"
    """vLLM ``--kv-cache-dtype``: auto (the activations' dtype) or fp8."""
    extra_args: list[str] = Field(default_factory=list)

    def args(self) -> list[str]:
        """The flags as `vllm serve` arguments (without the model and the tensor parallelism)."""
        out = [
            f"--dtype {self.dtype}",
            f"--max-model-len {self.max_model_len}",
            f"--max-num-seqs {self.max_num_seqs}",
            f"--max-num-batched-tokens {self.max_num_batched_tokens}",
            f"--gpu-memory-utilization {self.gpu_memory_utilization:g}",
            f"--block-size {self.block_size}",
            "--enable-prefix-caching"
            if self.enable_prefix_caching
            else "--no-enable-prefix-caching",
        ]
        if self.enforce_eager:
            out.append("--enforce-eager")
        if self.quantization:
            out.append(f"--quantization {self.quantization}")
        if self.kv_cache_dtype != "auto":
            out.append(f"--kv-cache-dtype {self.kv_cache_dtype}")
        return out + list(self.extra_args)

    @property
    def dummy_weights(self) -> bool:
        """``--load-format dummy`` among the extra arguments: random weights."""
        args = " ".join(self.extra_args).replace("=", " ").split()
        return any(a == "--load-format" and b == "dummy" for a, b in pairwise(args))


class Replica(_Model):
    name: str
    host: str = "localhost"
    tp: PositiveInt
    gpu_ids: list[int]
    port: int = Field(ge=1, le=65535)
    pool: str = "default"


GATEWAY_PORT = 8000
"""fleet.yaml's default ``gateway.port`` (a gateway started alone defaults to 8080)."""


class Fleet(_Model):
    version: Literal[1] = 1
    model: ModelRef
    engine: Literal["vllm", "sim"] = "vllm"
    gpus: GPUs
    vllm: VLLMFlags
    replicas: list[Replica] = Field(min_length=1)
    gateway: GatewayConfig = Field(default_factory=lambda: GatewayConfig(port=GATEWAY_PORT))
    """The gateway's own configuration (gateway/config.py, docs/gateway.md), every option of
    it; its replicas are this file's ``replicas`` (its own ``replicas`` list stays empty)."""

    @model_validator(mode="before")
    @classmethod
    def _gateway_port(cls, data):
        if isinstance(data, dict) and isinstance(data.get("gateway"), dict):
            data = {**data, "gateway": {"port": GATEWAY_PORT, **data["gateway"]}}
        return data

    @model_validator(mode="after")
    def _consistent(self):
        if self.gateway.replicas:
            raise ValueError(
                "gateway.replicas: list the fleet's replicas under the top-level `replicas:`"
            )
        names = Counter(r.name for r in self.replicas)
        if dup := [n for n, c in names.items() if c > 1]:
            raise ValueError(f"replica names must be unique: {dup}")
        ports: dict[tuple[str, int], str] = {("localhost", self.gateway.port): "the gateway"}
        for r in self.replicas:
            if len(r.gpu_ids) != r.tp:
                raise ValueError(f"{r.name}: tp={r.tp} needs {r.tp} gpu_ids, got {r.gpu_ids}")
            if len(set(r.gpu_ids)) != r.tp:
                raise ValueError(f"{r.name}: gpu_ids {r.gpu_ids} name a GPU twice")
            for g in r.gpu_ids:
                if not 0 <= g < self.gpus.count:
                    raise ValueError(
                        f"{r.name}: GPU id {g} is not among the {self.gpus.count} GPUs of a host"
                    )
            if (r.host, r.port) in ports:
                raise ValueError(
                    f"{r.name}: port {r.port} of {r.host} is already {ports[r.host, r.port]}'s"
                )
            ports[r.host, r.port] = r.name
        self._check_gpu_sharing()
        return self

    def _check_gpu_sharing(self) -> None:
        owners: dict[tuple[str, int], list[Replica]] = {}
        for r in self.replicas:
            for g in r.gpu_ids:
                owners.setdefault((r.host, g), []).append(r)
        gmu = self.vllm.gpu_memory_utilization
        for (host, g), rs in owners.items():
            if len(rs) == 1:
                continue
            names = ", ".join(r.name for r in rs)
            if len(rs) * gmu > 1.0 + 1e-9:
                raise ValueError(
                    f"GPU {g} of {host} is shared by {len(rs)} replicas ({names}): "
                    f"{len(rs)} x vllm.gpu_memory_utilization {gmu:g} = {len(rs) * gmu:.2f} "
                    f"of its memory; lower gpu_memory_utilization to at most "
                    f"{1.0 / len(rs):.2f} or give each replica its own GPUs"
                )
            if len({tuple(sorted(r.gpu_ids)) for r in rs}) > 1:
                raise ValueError(
                    f"GPU {g} of {host} is shared by replicas with different gpu_ids ({names}): "
                    "replicas that share a GPU must share the same set of GPUs"
                )

    def replicas_per_gpu(self) -> int:
        """How many replicas share each GPU (1: none share). Raises when it differs by GPU."""
        counts = Counter((r.host, g) for r in self.replicas for g in r.gpu_ids)
        values = set(counts.values())
        if len(values) > 1:
            raise ValueError(
                "some GPUs carry more replicas than others; the simulator models one sharing "
                "factor per fleet"
            )
        return values.pop()

    def gpu_sharers(self, replica: Replica) -> list[Replica]:
        """The other replicas of ``replica``'s host that use one of its GPUs."""
        mine = set(replica.gpu_ids)
        return [
            r
            for r in self.replicas
            if r.name != replica.name and r.host == replica.host and mine & set(r.gpu_ids)
        ]

    def deployment_settings(self) -> dict:
        """``resolve_deployment`` keywords for simulating this fleet (``servefleet simulate
        --fleet``): one TP and one GPU-sharing factor for all replicas."""
        tps = {r.tp for r in self.replicas}
        if len(tps) > 1:
            raise ValueError(
                f"replicas of different TP ({sorted(tps)}): simulate each group on its own"
            )
        v = self.vllm
        return {
            "tp": tps.pop(),
            "replicas": len(self.replicas),
            "replicas_per_gpu": self.replicas_per_gpu(),
            "dtype": v.dtype,
            "max_model_len": v.max_model_len,
            "max_num_seqs": v.max_num_seqs,
            "max_num_batched_tokens": v.max_num_batched_tokens,
            "gpu_memory_utilization": v.gpu_memory_utilization,
            "block_size": v.block_size,
            "enable_prefix_caching": v.enable_prefix_caching,
            "enforce_eager": v.enforce_eager,
            "kv_cache_dtype": v.kv_cache_dtype,
            "answers": RANDOM_WEIGHTS if v.dummy_weights else EXACT,
        }

    @property
    def served_names(self) -> list[str]:
        """The names clients may ask for: what the user named first (the repo id or local
        path vLLM loads, as plain `vllm serve` would answer to), then the preset's name."""
        return list(dict.fromkeys((self.model.path, self.model.name)))

    def cuda_visible_devices(self, replica: Replica) -> str:
        return ",".join(map(str, replica.gpu_ids))

    def serve_command(self, replica: Replica) -> str:
        """The `vllm serve` line of one replica, pinned to its GPUs."""
        parts = [
            f"CUDA_VISIBLE_DEVICES={self.cuda_visible_devices(replica)}",
            f"vllm serve {self.model.path}",
            f"--served-model-name {' '.join(map(shlex.quote, self.served_names))}",
            f"--tensor-parallel-size {replica.tp}",
            *self.vllm.args(),
        ]
        if self.model.trust_remote_code:
            parts.append("--trust-remote-code")
        parts.append(f"--port {replica.port}")
        return " ".join(parts)


HEADER = (
    "# fleet.yaml — what `servefleet up` starts (schema: servefleet.plan.fleet_yaml.Fleet,\n"
    "# documented in docs/plan.md). Written by `servefleet plan`; edit freely.\n"
)


def dump_fleet(fleet: Fleet) -> str:
    data = fleet.model_dump(mode="json")
    # the gateway's settings as written (its defaults are documented once, in docs/gateway.md)
    data["gateway"] = {
        "host": fleet.gateway.host,
        "port": fleet.gateway.port,
        **fleet.gateway.model_dump(mode="json", exclude_unset=True),
    }
    body = yaml.safe_dump(data, sort_keys=False, default_flow_style=None)
    return HEADER + body


def parse_fleet(text: str, origin: str = "fleet.yaml") -> Fleet:
    """The fleet of a fleet.yaml's text; every error names ``origin`` and, where the setting is
    in the file, its line."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(syntax_error(origin, e)) from None
    if not isinstance(data, dict):
        raise ValueError(f"{origin}: expected a mapping (model:, engine:, gpus:, ...) at the top")
    try:
        return Fleet.model_validate(data)
    except ValidationError as e:
        root = compose(text)
        lines = [f"{origin}: invalid fleet:"]
        for err in e.errors():
            loc = ".".join(map(str, err["loc"])) or "(top level)"
            line = line_of(root, err["loc"])
            where = f"{origin}:{line}: " if line is not None else ""
            lines.append(f"  {where}{loc}: {err['msg'].removeprefix('Value error, ')}")
        raise ValueError("\n".join(lines)) from None


def load_fleet(path: str | Path) -> Fleet:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"{p}: cannot read: {e.strerror}") from None
    fleet = parse_fleet(text, str(p))
    auth = fleet.gateway.auth
    if auth.keys_file is not None:
        keys = Path(auth.keys_file)
        auth.keys_file = str(keys if keys.is_absolute() else (p.parent / keys).resolve())
        try:
            load_keys(auth.keys_file)
        except ConfigError as e:
            raise ValueError(f"{p}: gateway.{e}") from None
    return fleet
