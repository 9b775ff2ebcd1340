"""The prefix-hit rate of a measured point: prompt tokens served from the prefix cache ÷ prompt
tokens, over the point's requests, each counted once — what a user means by it, and what
`servefleet simulate` reports (the engine counts it: ``PrefixCacheStats.cached_tokens`` ÷
``prompt_tokens``). docs/metrics.md, "prefix hit".

A server may give it three ways; the first available is used (``source``):

* ``requests``: each request's ``usage.prompt_tokens_details.cached_tokens`` (vLLM and the
  sim-server with ``--enable-prompt-tokens-details``), over the requests that succeeded with it;
* ``server prompt tokens``: ``vllm:prompt_tokens_cached`` ÷ ``vllm:prompt_tokens``, which vLLM
  0.26 counts once per request, at its first prefill — the same ratio, over every request the
  server prefilled during the point;
* ``server lookups``: ``vllm:prefix_cache_hits`` ÷ ``vllm:prefix_cache_queries``, for a server
  without those. vLLM counts these at every scheduling attempt of a waiting request: a queue head
  blocked for KV blocks is looked up again each step, so whenever requests queue the rate weighs
  the requests that waited by their retries — typically low, as they are the long prompts that
  do not fit (on the H200, enterprise-mix at 3 req/s: 1.4 % against 4.1 % per request; about the
  same in tests/test_prefix_hit.py, where every prompt shares its system prompt). A note says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from servefleet.records import RequestRecord

REQUESTS = "requests"
SERVER_PROMPT_TOKENS = "server prompt tokens"
SERVER_LOOKUPS = "server lookups"


@dataclass(frozen=True, slots=True)
class PrefixHit:
    rate: float | None
    source: str | None
    """``requests``, ``server prompt tokens``, ``server lookups``; None when nothing told."""
    note: str | None = None
    """Why the rate may mislead (the lookup counters under queueing)."""

    def to_dict(self) -> dict:
        return {"rate": self.rate, "source": self.source, "note": self.note}


def prefix_hit(records: Iterable[RequestRecord], server: Mapping | None) -> PrefixHit:
    """The rate from the point's records and its server view (``ServerView.to_dict()``: keys
    ``prompt_tokens``, ``prompt_cached``, ``prefix_queries``, ``prefix_hits``,
    ``peak_waiting``), by the first source that has it."""
    prompt = cached = 0
    for r in records:
        if r.ok and r.cached_tokens is not None:
            prompt += r.prompt_tokens
            cached += r.cached_tokens
    if prompt:
        return PrefixHit(cached / prompt, REQUESTS)
    srv = server or {}
    pt, pc = srv.get("prompt_tokens"), srv.get("prompt_cached")
    if pt and pc is not None:
        return PrefixHit(pc / pt, SERVER_PROMPT_TOKENS)
    q, h = srv.get("prefix_queries"), srv.get("prefix_hits")
    if q and h is not None:
        waiting = srv.get("peak_waiting")
        queued = f" (up to {waiting:,.0f} waiting here)" if waiting else ""
        return PrefixHit(
            h / q,
            SERVER_LOOKUPS,
            "prefix hit from the server's prefix_cache_hits ÷ prefix_cache_queries: vLLM counts "
            f"a lookup at every scheduling attempt, so when requests queue{queued} the requests "
            "that waited weigh by their retries, and it usually under-states the share of prompt "
            "tokens served from the cache (start vLLM with --enable-prompt-tokens-details for the "
            "per-request figure)",
        )
    return PrefixHit(None, None)
