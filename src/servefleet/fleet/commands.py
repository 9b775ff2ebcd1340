"""What each process of a fleet runs: argv, environment, the gateway's config file.

The fleet.yaml schema is ``servefleet.plan.fleet_yaml.Fleet``; this module only turns it into
command lines (``vllm serve`` pinned with ``CUDA_VISIBLE_DEVICES``, or a sim-server).
"""

from __future__ import annotations

import importlib.util
import shlex
import shutil
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from servefleet.plan.fleet_yaml import Fleet, Replica

from .hosts import LOCAL_HOSTS, Placement

__all__ = ["LOCAL_HOSTS"]  # the exports' name for `localhost`-like hosts


class FleetError(ValueError):
    """A fleet that cannot be started here; the message names the cause and the fix."""


@dataclass(frozen=True)
class SimOptions:
    """How simulated replicas run (``engine: sim``)."""

    time_scale: float = 1.0
    """Replicas run this many times faster than the modelled GPU."""
    startup_time: float | None = None
    """Seconds of 'loading' (None: the predicted vllm start-up / time_scale)."""


@dataclass(frozen=True)
class Spec:
    """One process to run."""

    name: str
    argv: list[str]
    port: int
    env: dict[str, str] = field(default_factory=dict)
    host: str = "127.0.0.1"
    """Where this host reaches the process (its health checks)."""
    ready_marker: str | None = None
    """A stdout line containing this means the process listens (None: only /health)."""
    health_path: str = "/health"
    start_after: tuple[str, ...] = ()
    """Processes that must be ready before this one starts (replicas sharing a GPU: vLLM
    profiles the GPU's free memory at start-up, so two starting together disturb each other)."""


def start_after(fleet: Fleet, r: Replica) -> tuple[str, ...]:
    """The replicas listed before ``r`` that share one of its GPUs."""
    sharers = {s.name for s in fleet.gpu_sharers(r)}
    before = []
    for other in fleet.replicas:
        if other.name == r.name:
            break
        if other.name in sharers:
            before.append(other.name)
    return tuple(before)


def vllm_spec(fleet: Fleet, r: Replica, launcher: list[str], bind: str = "127.0.0.1") -> Spec:
    parts = shlex.split(fleet.serve_command(r))
    env = {}
    while parts and "=" in parts[0] and not parts[0].startswith("-"):
        k, _, v = parts.pop(0).partition("=")
        env[k] = v
    assert parts[0] == "vllm", parts
    argv = [*launcher, *parts[1:], "--host", bind]
    return Spec(r.name, argv, r.port, env, _reach(bind), start_after=start_after(fleet, r))


def _reach(bind: str) -> str:
    return "127.0.0.1" if bind == "0.0.0.0" else bind


def vllm_launcher() -> list[str]:
    """How to run vLLM's CLI here: the `vllm` script on PATH, else this Python's vllm package
    (an environment where vllm is importable but its scripts are not installed)."""
    if (path := shutil.which("vllm")) is not None:
        return [path]
    if importlib.util.find_spec("vllm") is not None:
        return [sys.executable, "-m", "vllm.entrypoints.cli.main"]
    raise FleetError(
        "`vllm` was not found on PATH and this Python cannot import it: install it on this GPU "
        "host (pip install vllm) and activate its environment, or set `engine: sim` in "
        "fleet.yaml to run simulated replicas instead"
    )


def sim_spec(fleet: Fleet, r: Replica, sim: SimOptions, bind: str = "127.0.0.1") -> Spec:
    argv = [
        sys.executable,
        "-m",
        "servefleet.sim.server",
        "--model",
        fleet.model.name,
        "--served-model-name",
        *fleet.served_names,
        "--gpu",
        fleet.gpus.type,
        "--tensor-parallel-size",
        str(r.tp),
    ]
    for a in fleet.vllm.args():
        argv += a.split(" ", 1)
    argv += ["--host", bind, "--port", str(r.port), "--time-scale", f"{sim.time_scale:g}"]
    if sim.startup_time is not None:
        argv += ["--startup-time", f"{sim.startup_time:g}"]
    return Spec(
        r.name,
        argv,
        r.port,
        host=_reach(bind),
        ready_marker="sim-server ready",
        start_after=start_after(fleet, r),
    )


def replica_specs(fleet: Fleet, sim: SimOptions, placement: Placement | None = None) -> list[Spec]:
    """The processes of this host's replicas (``placement``: which are this host's; default:
    those on ``localhost``). Replicas of other hosts are not started here (hosts.py)."""
    placement = placement or Placement()
    local = placement.local(fleet)
    if fleet.engine == "vllm" and local:
        launcher = vllm_launcher()
        return [vllm_spec(fleet, r, launcher, placement.bind(r)) for r in local]
    return [sim_spec(fleet, r, sim, placement.bind(r)) for r in local]


def replica_entry(fleet: Fleet, r: Replica, url: str, max_in_flight: int | None) -> dict:
    """One replica in the gateway's config: where it is, its pool and cap, and what it runs
    (for the predicted-latency policy's cost model)."""
    return {
        "url": url,
        "name": r.name,
        "pool": r.pool,
        "max_in_flight": max_in_flight,
        "model": fleet.model.name,
        "gpu": fleet.gpus.type,
        "tp": r.tp,
        "max_num_batched_tokens": fleet.vllm.max_num_batched_tokens,
        "max_num_seqs": fleet.vllm.max_num_seqs,
    }


def gateway_config(
    fleet: Fleet,
    *,
    health_interval: float | None = 1.0,
    drain_timeout: float = 30.0,
    url_of: Callable[[Replica], str] | None = None,
    redis_url: str | None = None,
) -> dict:
    """The gateway's config (gateway/config.py) for `fleet`: fleet.yaml's ``gateway:`` as
    written, with every replica by ``url_of(r)`` (default: where a `localhost` replica listens,
    other hosts' at host:port), its pool and the fleet's cap. Settings fleet.yaml leaves out
    take `up`'s values (``health_interval``, None: the gateway's; ``drain_timeout``); ``redis_url`` is where the
    rate limits' buckets go when fleet.yaml names no Redis of its own."""
    g = fleet.gateway
    url_of = url_of or Placement().url
    cfg = g.model_dump(mode="json", exclude_unset=True, exclude={"replicas"})
    cfg["host"], cfg["port"] = g.host, g.port
    cfg["replicas"] = [
        replica_entry(fleet, r, url_of(r), g.max_in_flight_per_replica) for r in fleet.replicas
    ]
    if health_interval is not None:
        cfg.setdefault("health", {"interval": health_interval, "healthy_threshold": 1})
    cfg.setdefault("drain_timeout", drain_timeout)
    if redis_url and g.rate_limit.redis_url is None and needs_redis(fleet):
        cfg.setdefault("rate_limit", {})["redis_url"] = redis_url
    return cfg


def needs_redis(fleet: Fleet) -> bool:
    """Whether the gateway uses Redis: rate limits to share, or API keys in a Redis hash."""
    return fleet.gateway.rate_limit.enabled or fleet.gateway.auth.redis_hash is not None


def gateway_spec(config_path: str, port: int, health_path: str = "/ready") -> Spec:
    """The gateway process; ready on its ready line and ``health_path`` (`/ready`: a replica
    is routable; `/health` on a host that starts no replica of its own)."""
    argv = [sys.executable, "-m", "servefleet.gateway", "--config", config_path]
    return Spec("gateway", argv, port, ready_marker="gateway ready", health_path=health_path)


def check_ports(fleet: Fleet, placement: Placement | None = None, gateway: bool = True) -> None:
    """Refuse to start when a port this host would listen on is taken, naming the field."""
    placement = placement or Placement()
    wanted = []
    if gateway:
        wanted.append(
            (f"gateway.port ({fleet.gateway.port})", fleet.gateway.host, fleet.gateway.port)
        )
    wanted += [
        (f"replicas[{i}].port ({r.name})", placement.bind(r), r.port)
        for i, r in enumerate(fleet.replicas)
        if placement.is_local(r)
    ]
    busy = [(what, host, port) for what, host, port in wanted if not port_free(host, port)]
    if busy:
        lines = [f"port {port} is in use on {host}: {what}" for what, host, port in busy]
        raise FleetError(
            "\n".join(lines) + "\nstop what listens there (`ss -ltnp`; an earlier `servefleet up`: "
            "`servefleet down`), or change the port in fleet.yaml"
        )


def port_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        # as the servers bind (aiohttp sets SO_REUSEADDR): TIME_WAIT does not count as in use
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(n: int) -> list[int]:
    """n ports free on the loopback now (held together so that they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
