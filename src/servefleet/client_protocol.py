"""How a client streams from vLLM's API server: the endpoint and whether it asks for usage on
every chunk, as ``servefleet bench`` streams, ``simulate``/``plan`` assume (``--endpoint``,
``--client-protocol``) and a run's ``summary.json`` records. What it costs the API server is the
simulator's (``sim.client_protocol``).

A client streams from ``/v1/chat/completions`` or ``/v1/completions``, with usage in the last
chunk only (what the OpenAI SDK sends: ``stream_options`` absent or ``include_usage``) or on
every chunk (vLLM's ``stream_options.continuous_usage_stats``).
"""

from __future__ import annotations

from dataclasses import dataclass

ENDPOINTS = ("chat", "completions")
STREAM_OPTIONS = {"sdk": False, "usage-per-chunk": True}
"""``--client-protocol`` names: usage in the last chunk only (the OpenAI SDK's default), or
usage on every chunk (``continuous_usage_stats``)."""


@dataclass(frozen=True, slots=True)
class ClientProtocol:
    """How a client streams: its endpoint and whether it asks for usage on every chunk."""

    endpoint: str = "chat"
    usage_per_chunk: bool = False

    def __post_init__(self) -> None:
        if self.endpoint not in ENDPOINTS:
            raise ValueError(f"endpoint {self.endpoint!r}: use chat or completions")

    @property
    def stream_options(self) -> str:
        """The ``--client-protocol`` name of its stream options."""
        return "usage-per-chunk" if self.usage_per_chunk else "sdk"

    @property
    def name(self) -> str:
        return f"{self.endpoint}-{self.stream_options}"

    def describe(self) -> str:
        """As reports name a client protocol."""
        usage = (
            "usage on every chunk"
            if self.usage_per_chunk
            else "usage in the last chunk only (OpenAI SDK)"
        )
        return f"{self.endpoint}, {usage}"

    def to_dict(self) -> dict:
        """As a bench run's summary records its client (``endpoint``, ``continuous_usage``)."""
        return {"endpoint": self.endpoint, "continuous_usage": self.usage_per_chunk}


SDK_CHAT = ClientProtocol()
"""The default: a chat client using the OpenAI SDK (no per-chunk usage)."""
VLLM_BENCH_SERVE = ClientProtocol("completions", False)
"""How ``vllm bench serve`` streams (``/v1/completions``, usage in the last chunk only)."""


def of_run(meta: dict) -> ClientProtocol | None:
    """The protocol a run's ``summary.json`` records: its ``client`` record (a bench run, or a
    simulation that assumed one: ``servefleet simulate --client-protocol``), else a bench run's
    settings; a bench run from before the setting was recorded asked for per-chunk usage (the
    default then). None where a simulation does not say (one written before it did)."""
    c = meta.get("client") or {}
    if "continuous_usage" in c:
        return ClientProtocol(c.get("endpoint", "chat"), bool(c["continuous_usage"]))
    if meta.get("kind", "bench") != "bench":
        return None
    endpoint = (meta.get("target") or {}).get("endpoint", "chat")
    return ClientProtocol(
        endpoint, bool((meta.get("settings") or {}).get("continuous_usage", True))
    )


def of_bench(meta: dict) -> ClientProtocol:
    """The protocol a ``servefleet bench`` run streamed with (``of_run``)."""
    protocol = of_run({**meta, "kind": "bench"})
    assert protocol is not None
    return protocol


def client_protocol(endpoint: str = "chat", stream_options: str = "sdk") -> ClientProtocol:
    """The protocol of ``--endpoint`` and ``--client-protocol`` (ValueError names the flag)."""
    if stream_options not in STREAM_OPTIONS:
        raise ValueError(f"--client-protocol {stream_options!r}: use {' or '.join(STREAM_OPTIONS)}")
    if endpoint not in ENDPOINTS:
        raise ValueError(f"--endpoint {endpoint!r}: use chat or completions")
    return ClientProtocol(endpoint, STREAM_OPTIONS[stream_options])
