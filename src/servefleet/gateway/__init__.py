"""The gateway: an OpenAI-compatible router in front of vLLM replicas (docs/gateway.md).

Transport (``proxy``, ``app``), health (``health``, ``breaker``), admission (``admission``,
``ratelimit``) and metrics (``metrics``, ``scrape``) are separate modules; the choice of a
replica is the routing policy's (``servefleet.routing``), never the transport's.
"""

from __future__ import annotations

__all__ = ["Gateway", "GatewayConfig", "load_config", "parse_config"]


def __getattr__(name: str):
    """Import on first use: `servefleet --help` must not pay for aiohttp's client."""
    if name == "Gateway":
        from servefleet.gateway.app import Gateway

        return Gateway
    if name in ("GatewayConfig", "load_config", "parse_config"):
        from servefleet.gateway import config

        return getattr(config, name)
    raise AttributeError(f"module 'servefleet.gateway' has no attribute {name!r}")
