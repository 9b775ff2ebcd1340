"""GPU telemetry for a fleet started by ``servefleet up``: which GPU carries which replicas,
and the endpoint that serves them."""

from __future__ import annotations

from servefleet.telemetry.exporter import TelemetryServer, serve_gpu_metrics


def gpu_replicas(fleet) -> dict[int, str]:
    """GPU index → the replicas placed on it (comma-separated when they share it)."""
    out: dict[int, list[str]] = {}
    for r in fleet.replicas:
        for g in r.gpu_ids:
            out.setdefault(int(g), []).append(r.name)
    return {g: ",".join(names) for g, names in sorted(out.items())}


def start_fleet_telemetry(fleet, port: int) -> TelemetryServer | str:
    """Serve the fleet's GPUs (engine vllm) on ``port``; else one line saying why not."""
    if fleet.engine != "vllm":
        return (
            "GPU telemetry: simulated replicas have no GPU; their /metrics carry the modelled "
            "busy time (servefleet:sim_gpu_busy_seconds), which `servefleet bench` records"
        )
    if port <= 0:
        return "GPU telemetry off (--gpu-metrics-port 0)"
    return serve_gpu_metrics(gpu_replicas(fleet), port)
