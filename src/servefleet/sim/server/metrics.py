"""``/metrics``: vLLM's Prometheus metrics (names, types, help, buckets, labels) and the
sim-server's own lag behind the engine model.

Names and buckets follow vLLM V1's ``PrometheusStatLogger`` (vllm/v1/metrics/loggers.py and
buckets.py) and a real vLLM 0.26 scrape — the same names, no more (docs/metrics.md lists what
they say about preemption), besides the sim-server's own ``servefleet:`` series: every series carries ``engine="0"`` and
``model_name``; counters end in ``_total`` (prometheus_client adds it) with their ``_created``
companions, as vLLM's do. All times are wall-clock seconds as the server experiences them
(so with ``--time-scale 10`` they are a tenth of the modelled GPU times).

Each app gets its own ``CollectorRegistry`` (nothing registers globally), so several servers
can live in one process (tests).
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.gc_collector import GCCollector
from prometheus_client.metrics_core import Metric
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

if TYPE_CHECKING:
    from servefleet.engine import Engine

REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
TIME_TO_FIRST_TOKEN_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
INTER_TOKEN_LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
REQUEST_PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
LAG_BUCKETS = (
    25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3, 25e-3, 50e-3, 0.1, 0.25,
    1.0,
)  # fmt: skip
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value`` (vLLM's token-count buckets)."""
    out, exp = [], 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**exp
            if v > max_value:
                return out
            out.append(v)
        exp += 1


class FastHistogram(Collector):
    """A histogram for the per-token and per-step hot path: no lock, one ``bisect`` per
    observation (prometheus_client's takes a lock for each value it updates). Exposed
    exactly as prometheus_client exposes a histogram (``_bucket``, ``_count``, ``_sum``,
    ``_created``). Only the event loop's thread observes it."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labels: dict[str, str],
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self.name, self.documentation, self.labels = name, documentation, labels
        self.bounds = [float(b) for b in buckets]
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.created = time.time()
        registry.register(self)

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def collect(self) -> Iterable[Metric]:
        m = Metric(self.name, self.documentation, "histogram")
        cum = 0
        for bound, count in zip([*self.bounds, float("inf")], self.counts, strict=True):
            cum += count
            m.add_sample(f"{self.name}_bucket", {**self.labels, "le": floatToGoString(bound)}, cum)
        m.add_sample(f"{self.name}_count", self.labels, cum)
        m.add_sample(f"{self.name}_sum", self.labels, self.sum)
        m.add_sample(f"{self.name}_created", self.labels, self.created)
        yield m


class ServerMetrics:
    """The registry and the handles the engine loop updates."""

    def __init__(
        self,
        model_name: str,
        max_model_len: int,
        engine: Engine,
        cache_info: dict[str, str],
        sim_info: dict[str, str],
        lag_now: Callable[[], float],
    ) -> None:
        reg = self.registry = CollectorRegistry(auto_describe=True)
        for collector in (ProcessCollector, PlatformCollector, GCCollector):
            collector(registry=reg)  # vLLM's scrape has the process_/python_ series too
        labels = ("model_name", "engine")
        lv = (model_name, "0")
        self.labelvalues = lv

        def gauge(name: str, doc: str, fn: Callable[[], float]) -> None:
            Gauge(name, doc, labels, registry=reg).labels(*lv).set_function(fn)

        def counter(name: str, doc: str):
            return Counter(name, doc, labels, registry=reg).labels(*lv)

        def hist(name: str, doc: str, buckets):
            return Histogram(name, doc, labels, buckets=buckets, registry=reg).labels(*lv)

        def fast_hist(name: str, doc: str, buckets) -> FastHistogram:
            return FastHistogram(name, doc, dict(zip(labels, lv, strict=True)), buckets, reg)

        sched = engine.scheduler
        gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            lambda: len(sched.running),
        )
        gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            lambda: len(sched.waiting),
        )
        gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            lambda: engine.kv_usage,
        )
        self.prefix_cache_queries = counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        )
        self.prefix_cache_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        counter(  # no KV connector: always 0, as on a vLLM without one
            "vllm:external_prefix_cache_queries",
            "External prefix cache queries from KV connector cross-instance cache sharing, in "
            "terms of number of queried tokens.",
        )
        counter(
            "vllm:external_prefix_cache_hits",
            "External prefix cache hits from KV connector cross-instance cache sharing, in "
            "terms of number of cached tokens.",
        )
        self.num_preemptions = counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        )
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        by_source = Counter(
            "vllm:prompt_tokens_by_source",
            "Number of prompt tokens by source.",
            (*labels, "source"),
            registry=reg,
        )
        self.prompt_tokens_by_source = {s: by_source.labels(*lv, s) for s in PROMPT_SOURCES}
        self.prompt_tokens_cached = counter(
            "vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external)."
        )
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        )
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            (*labels, "finished_reason"),
            registry=reg,
        )
        self.request_success = {r: success.labels(*lv, r) for r in FINISH_REASONS}
        token_buckets = build_1_2_5_buckets(max_model_len)
        self.request_prompt_tokens = hist(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", token_buckets
        )
        self.request_generation_tokens = hist(
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            token_buckets,
        )
        self.iteration_tokens = fast_hist(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            ITERATION_TOKENS_BUCKETS,
        )
        self.request_max_num_generation_tokens = hist(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            token_buckets,
        )
        self.request_params_n = hist(
            "vllm:request_params_n",
            "Histogram of the n request parameter.",
            REQUEST_PARAMS_N_BUCKETS,
        )
        self.request_params_max_tokens = hist(
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            token_buckets,
        )
        self.request_prefill_kv_computed_tokens = hist(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            token_buckets,
        )
        self.time_to_first_token = hist(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TIME_TO_FIRST_TOKEN_BUCKETS,
        )
        self.inter_token_latency = fast_hist(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            INTER_TOKEN_LATENCY_BUCKETS,
        )
        self.request_time_per_output_token = hist(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            INTER_TOKEN_LATENCY_BUCKETS,
        )
        self.e2e_request_latency = hist(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.request_queue_time = hist(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.request_inference_time = hist(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.request_prefill_time = hist(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.request_decode_time = hist(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        info = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            ("engine", *sorted(cache_info)),
            registry=reg,
        )
        info.labels("0", *(cache_info[k] for k in sorted(cache_info))).set(1)
        # -- the sim-server's own ----------------------------------------------------------
        Gauge(
            "servefleet:sim_lag_seconds",
            "How late the sim-server delivered the last engine step's tokens, in seconds behind "
            "the engine model's schedule (wall clock).",
            labels,
            registry=reg,
        ).labels(*lv).set_function(lag_now)
        self.lag_max = Gauge(
            "servefleet:sim_lag_max_seconds",
            "Largest delivery lag behind the engine model's schedule since start, in seconds.",
            labels,
            registry=reg,
        ).labels(*lv)
        self.step_lag = fast_hist(
            "servefleet:sim_step_lag_seconds",
            "Histogram of the delivery lag of each engine step behind the model's schedule.",
            LAG_BUCKETS,
        )
        self.steps = counter("servefleet:sim_steps", "Engine steps run by the sim-server.")
        self.model_busy = counter(
            "servefleet:sim_model_busy_seconds",
            "Modelled GPU time of the steps run (seconds, before --time-scale).",
        )
        self.time_scale = float(sim_info.get("time_scale", 1.0))
        self.gpu_busy = counter(
            "servefleet:sim_gpu_busy_seconds",
            "Wall-clock seconds a modelled engine step was running (modelled time ÷ "
            "--time-scale): its rate is the modelled GPU busy fraction.",
        )
        self.recomputed_tokens = counter(
            "servefleet:sim_recomputed_tokens",
            "Tokens prefilled again after a preemption (the truth vLLM's /metrics do not give; "
            "for tests of the re-prefill bounds).",
        )
        sim = Gauge(
            "servefleet:sim_info",
            "The sim-server's model, GPU and settings.",
            ("model_name", *sorted(sim_info)),
            registry=reg,
        )
        sim.labels(model_name, *(sim_info[k] for k in sorted(sim_info))).set(1)

    def record_busy(self, duration: float) -> None:
        """A step of ``duration`` modelled seconds ran."""
        self.model_busy.inc(duration)
        self.gpu_busy.inc(duration / self.time_scale)

    def render(self) -> bytes:
        return generate_latest(self.registry)
