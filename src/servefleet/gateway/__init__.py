"""The gateway: an OpenAI-compatible router in front of vLLM replicas (docs/gateway.md).

Transport (``proxy``, ``app``), health (``health``, ``breaker``), admission (``admission``,
``ratelimit``) and metrics (``metrics``, ``scrape``) are separate modules; the choice of a
replica is the routing policy's (``servefleet.routing``), never the transport's.
"""

from servefleet.gateway.app import Gateway
from servefleet.gateway.config import GatewayConfig, load_config, parse_config

__all__ = ["Gateway", "GatewayConfig", "load_config", "parse_config"]
