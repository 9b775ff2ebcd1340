"""What the target says about itself, for the report's header: ``GET /version``, a servefleet
gateway's ``GET /fleet`` (replicas, GPU, TP, flags), and the info gauges of the first
replica's ``/metrics`` (vLLM's ``vllm:cache_config_info``: KV blocks, tokens, memory share;
the sim-server's ``servefleet:sim_info``). Whatever does not answer is left out."""

from __future__ import annotations

import contextlib

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from servefleet.bench.fetch import get_json, get_text

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


async def server_info(session: aiohttp.ClientSession, base_url: str) -> dict:
    base = base_url.rstrip("/")
    info: dict = {}
    version = await _get(session, base + "/version", json=True)
    if isinstance(version, dict) and version.get("version"):
        info["version"] = str(version["version"])
    fleet = await _get(session, base + "/fleet", json=True)
    metrics_url = base + "/metrics"
    if isinstance(fleet, dict) and isinstance(fleet.get("replicas"), list):
        reps = [r for r in fleet["replicas"] if isinstance(r, dict)]
        info["replicas"] = [{k: r[k] for k in REPLICA_KEYS if k in r} for r in reps]
        if reps and isinstance(reps[0].get("url"), str):
            metrics_url = reps[0]["url"].rstrip("/") + "/metrics"
    text = await _get(session, metrics_url)
    if isinstance(text, str):
        with contextlib.suppress(ValueError):  # not the Prometheus text format
            info.update(info_labels(text))
    return info


async def _get(session: aiohttp.ClientSession, url: str, json: bool = False):
    try:
        status, body = await (get_json if json else get_text)(session, url)
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
        return None
    return body if status == 200 else None
