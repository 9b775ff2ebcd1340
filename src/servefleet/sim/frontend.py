"""vLLM's API server in front of one engine, as the simulator sees it.

A request reaches the scheduler after a fixed latency (HTTP parsing, IPC to the engine core,
first-token detokenization and streaming) and after the server has processed the requests ahead
of it (tokenization and request set-up are serial in the API server process): a FIFO server with
``service_s`` per request. Both come from ``Efficiency`` (``request_latency_s``,
``frontend_request_s``); on the H200 the latency is fitted to real vLLM and the service time is 0.

Real vLLM's API server is one asyncio loop that shares its CPU among the requests it admits and
the tokens it streams (≈ 1.2 ms + 1.2 µs per prompt token per request): a burst reaches the engine
together and its first tokens come back in clumps. A FIFO service time instead trickles a burst
into the engine, which keeps up, and lowers TTFT; docs/validation.md ("TTFT under load") has the
measurements and what a shared-processor model needs from the cluster.
"""

from __future__ import annotations


class Frontend:
    __slots__ = ("free_at", "latency_s", "service_s")

    def __init__(self, latency_s: float = 0.0, service_s: float = 0.0) -> None:
        if latency_s < 0 or service_s < 0:
            raise ValueError("front-end latency and service time must be >= 0")
        self.latency_s = latency_s
        self.service_s = service_s
        self.free_at = 0.0

    def admit(self, t: float) -> float:
        """When a request that arrives at ``t`` reaches the scheduler."""
        start = t if t > self.free_at else self.free_at
        self.free_at = start + self.service_s
        return self.free_at + self.latency_s
