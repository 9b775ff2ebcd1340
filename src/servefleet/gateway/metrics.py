"""The gateway's Prometheus metrics, in a registry of its own (one per app, so that tests and
several gateways in one process never share counters).

``labels()`` costs a lock and a tuple of strings per call; the request path takes its labelled
children through ``_Children`` caches instead (one dict lookup)."""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0,
    1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
QUEUE_BUCKETS = (0.0001, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
P = "servefleet_gateway_"


class _Children:
    """``metric.labels(*values)``, cached by the label values."""

    __slots__ = ("cache", "metric")

    def __init__(self, metric) -> None:
        self.metric = metric
        self.cache: dict[tuple[str, ...], object] = {}

    def __call__(self, *values: str):
        c = self.cache.get(values)
        if c is None:
            c = self.cache[values] = self.metric.labels(*values)
        return c


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = reg = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            P + "requests",
            "Requests answered, by route, HTTP status, replica that served them ('none': "
            "answered by the gateway) and routing decision.",
            ["route", "status", "replica", "decision"],
            registry=reg,
        )
        self.rejected = Counter(
            P + "rejected",
            "Requests the gateway answered itself, by reason (rate_limited, queue_full, "
            "queue_timeout, context_length_exceeded, body_too_large, invalid_request, "
            "no_replica, draining).",
            ["reason"],
            registry=reg,
        )
        self.ttft = Histogram(
            P + "time_to_first_token_seconds",
            "From the request's arrival at the gateway to the first output byte relayed.",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.e2e = Histogram(
            P + "e2e_request_latency_seconds",
            "From arrival at the gateway to the last byte relayed.",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.queue_time = Histogram(
            P + "queue_time_seconds",
            "Time spent in the gateway's admission queue.",
            buckets=QUEUE_BUCKETS,
            registry=reg,
        )
        self.in_flight = Gauge(
            P + "requests_in_flight", "Requests admitted and not finished.", registry=reg
        )
        self.queued = Gauge(
            P + "requests_queued", "Requests waiting in the admission queue.", registry=reg
        )
        self.replica_in_flight = Gauge(
            P + "replica_requests_in_flight",
            "Requests in flight per replica.",
            ["replica"],
            registry=reg,
        )
        self.retries = Counter(
            P + "retries",
            "Attempts sent again to another replica, by cause.",
            ["reason"],
            registry=reg,
        )
        self.resumptions = Counter(
            P + "resumptions",
            "Streams whose replica failed mid-stream, by outcome (resumed, error).",
            ["outcome"],
            registry=reg,
        )
        self.ejections = Counter(
            P + "ejections",
            "Replicas taken out of rotation, by source (health, breaker, stall, connect, "
            "first_token).",
            ["replica", "source"],
            registry=reg,
        )
        self.breaker_state = Gauge(
            P + "breaker_state",
            "Circuit breaker: 0 closed, 1 half-open, 2 open.",
            ["replica"],
            registry=reg,
        )
        self.replica_ready = Gauge(
            P + "replica_ready", "1 when the replica gets traffic.", ["replica"], registry=reg
        )
        self.decisions = Counter(
            P + "routing_decisions",
            "Routing decisions by policy and kind (affinity, miss, overloaded, load, ...).",
            ["policy", "decision"],
            registry=reg,
        )
        self.predicted_hit_tokens = Counter(
            P + "predicted_prefix_hit_tokens",
            "Prompt tokens the policy expected the chosen replica to have cached.",
            ["replica"],
            registry=reg,
        )
        self.routed_prompt_tokens = Counter(
            P + "routed_prompt_tokens",
            "Prompt tokens (as counted by the gateway) sent to each replica.",
            ["replica"],
            registry=reg,
        )
        self.replica_prefix_hits = Gauge(
            P + "replica_prefix_cache_hits",
            "The replica's own vllm:prefix_cache_hits_total at the last scrape.",
            ["replica"],
            registry=reg,
        )
        self.replica_prefix_queries = Gauge(
            P + "replica_prefix_cache_queries",
            "The replica's own vllm:prefix_cache_queries_total at the last scrape.",
            ["replica"],
            registry=reg,
        )
        self.client_disconnects = Counter(
            P + "client_disconnects", "Clients that went away before the end.", registry=reg
        )
        self.slow_clients = Counter(
            P + "slow_client_streams",
            "Streams closed because their client read nothing for stream.write_timeout s "
            "(counted among client_disconnects too; never against a replica).",
            registry=reg,
        )
        self.attempt_failures = Counter(
            P + "attempt_failures",
            "Failed attempts by replica and kind (fault, overloaded); a fault counts against "
            "the replica's breaker only when blamed.",
            ["replica", "kind"],
            registry=reg,
        )
        self.blamed = Counter(
            P + "blamed_failures",
            "Failures counted against a replica (its breaker and health checks).",
            ["replica"],
            registry=reg,
        )
        self.poisoned = Counter(
            P + "poisoned_requests",
            "Requests that failed the same way on two replicas: answered to the client, "
            "blamed on neither replica, tried on no other.",
            registry=reg,
        )
        self.ratelimit_degraded = Gauge(
            P + "ratelimit_degraded",
            "1 while the rate limiter's Redis is unavailable (counting locally, or refusing).",
            registry=reg,
        )
        self.ratelimit_fallbacks = Counter(
            P + "ratelimit_fallbacks",
            "Rate-limit checks made without Redis because it was unavailable.",
            registry=reg,
        )

        # the request path's children, cached (see _Children)
        self.requests_of = _Children(self.requests)
        self.ttft_of = _Children(self.ttft)
        self.e2e_of = _Children(self.e2e)
        self.decisions_of = _Children(self.decisions)
        self.predicted_hit_tokens_of = _Children(self.predicted_hit_tokens)
        self.routed_prompt_tokens_of = _Children(self.routed_prompt_tokens)
        self._caches = (
            self.requests_of, self.ttft_of, self.e2e_of, self.decisions_of,
            self.predicted_hit_tokens_of, self.routed_prompt_tokens_of,
        )  # fmt: skip

    def forget_replica(self, name: str) -> None:
        for c in self._caches:
            c.cache.clear()
        for g in (
            self.replica_in_flight,
            self.breaker_state,
            self.replica_ready,
            self.replica_prefix_hits,
            self.replica_prefix_queries,
        ):
            with contextlib.suppress(KeyError):
                g.remove(name)

    def render(self) -> bytes:
        return generate_latest(self.registry)
