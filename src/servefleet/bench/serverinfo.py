"""What the target says about itself, for the report's header: ``GET /version``, a servefleet
gateway's ``GET /fleet`` (replicas, GPU, TP, flags), and the info gauges of the first
replica's ``/metrics`` (vLLM's ``vllm:cache_config_info``: KV blocks, tokens, memory share;
the sim-server's ``servefleet:sim_info``). Whatever does not answer is left out; a gateway
that refuses ``/fleet`` for want of its admin token is said so (``fetch.refusal``)."""

from __future__ import annotations

import contextlib

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from servefleet.bench.fetch import get_json, get_text, refusal

INFO_GAUGES = {
    "vllm:cache_config_info": (
        "block_size",
        "num_gpu_blocks",
        "num_gpu_blocks_override",
        "kv_cache_size_tokens",
        "gpu_memory_utilization",
        "enable_prefix_caching",
    ),
    "servefleet:sim_info": (
        "gpu",
        "tensor_parallel_size",
        "dtype",
        "max_num_seqs",
        "max_num_batched_tokens",
        "time_scale",
    ),
}
REPLICA_KEYS = ("name", "url", "pool", "gpu", "tp", "max_num_seqs", "max_num_batched_tokens")


def info_labels(text: str) -> dict[str, dict[str, str]]:
    """The labels of the info gauges in a ``/metrics`` text (pure)."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            keys = INFO_GAUGES.get(s.name)
            if keys and s.name not in out:
                out[s.name] = {
                    k: s.labels[k] for k in keys if s.labels.get(k) not in (None, "None")
                }
    return out


async def server_info(
    session: aiohttp.ClientSession, base_url: str, token: str | None = None
) -> tuple[dict, str | None]:
    """(what the target says, or why a gateway would not say it: ``fetch.refusal``).
    ``token``: a gateway's admin token, sent to the target's ``/fleet`` and ``/metrics``."""
    base = base_url.rstrip("/")
    info: dict = {}
    version = await _get(session, base + "/version", json=True)
    if isinstance(version, dict) and version.get("version"):
        info["version"] = str(version["version"])
    fleet = await _get(session, base + "/fleet", json=True, token=token)
    if isinstance(fleet, int):
        return info, refusal(fleet, base + "/fleet", token)
    metrics_url, metrics_token = base + "/metrics", token
    if isinstance(fleet, dict) and isinstance(fleet.get("replicas"), list):
        reps = [r for r in fleet["replicas"] if isinstance(r, dict)]
        info["replicas"] = [{k: r[k] for k in REPLICA_KEYS if k in r} for r in reps]
        if reps and isinstance(reps[0].get("url"), str):
            metrics_url, metrics_token = reps[0]["url"].rstrip("/") + "/metrics", None
    text = await _get(session, metrics_url, token=metrics_token)
    if isinstance(text, str):
        with contextlib.suppress(ValueError):  # not the Prometheus text format
            info.update(info_labels(text))
    return info, None


async def _get(
    session: aiohttp.ClientSession, url: str, json: bool = False, token: str | None = None
):
    """The body; the status when it is a refusal (401, 403); None when nothing useful."""
    try:
        status, body = await (get_json if json else get_text)(session, url, token=token)
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
        return None
    if status in (401, 403):
        return status
    return body if status == 200 else None
