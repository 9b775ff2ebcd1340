"""GPU telemetry for a fleet started by ``servefleet up``: which GPU carries which replicas,
and the endpoint that serves them."""

from __future__ import annotations

from servefleet.telemetry.exporter import TelemetryServer, serve_gpu_metrics


def gpu_replicas(replicas) -> dict[int, str]:
    """GPU index → the replicas placed on it (comma-separated when they share it)."""
    out: dict[int, list[str]] = {}
    for r in replicas:
        for g in r.gpu_ids:
            out.setdefault(int(g), []).append(r.name)
    return {g: ",".join(names) for g, names in sorted(out.items())}


def start_fleet_telemetry(fleet, port: int, replicas=None) -> TelemetryServer | str:
    """Serve the GPUs of ``replicas`` (default: the fleet's; across hosts, this host's) on
    ``port`` (engine vllm); else one line saying why not."""
    if fleet.engine != "vllm":
        return (
            "GPU telemetry: simulated replicas have no GPU; their /metrics carry the modelled "
            "busy time (servefleet:sim_gpu_busy_seconds), which `servefleet bench` records"
        )
    if port <= 0:
        return "GPU telemetry off (--gpu-metrics-port 0)"
    gpus = gpu_replicas(fleet.replicas if replicas is None else replicas)
    if not gpus:
        return "GPU telemetry: no replica runs on this host"
    return serve_gpu_metrics(gpus, port, fleet.gateway.host)  # reachable where the gateway is
