"""The API server's CPU work per chunk and per token that each client protocol
(``servefleet.client_protocol``) costs.

vLLM 0.26's API server builds
each chunk of a stream on its one CPU (``serving_chat.py``/``serving_completion.py``): a chat
chunk is a ``ChatCompletionStreamResponse`` (choices, delta, role on the first), a completions
chunk a smaller ``CompletionStreamResponse``; with per-chunk usage each chunk also counts the
request's tokens and serializes a ``UsageInfo``. The work per chunk therefore depends on the
endpoint and the stream options, and the simulator's API server (``sim.frontend``) is given
the protocol's costs (``stream_work``).

The costs are the CPU seconds of the host the H200 measurements ran on (``STREAM_WORK``, each
with its source); another GPU's host scales them by its ``Efficiency.frontend_chunk_s`` against
``REFERENCE``'s (0 where the API server is not modelled).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from servefleet.client_protocol import VLLM_BENCH_SERVE, ClientProtocol
from servefleet.hardware import Efficiency


@dataclass(frozen=True, slots=True)
class StreamWork:
    """The API server's CPU seconds to stream with one protocol: per chunk sent (building and
    serializing the response, SSE framing, usage accounting) and per token streamed
    (output processing and detokenization, whatever the chunking)."""

    chunk_s: float
    token_s: float
    source: str


REFERENCE = VLLM_BENCH_SERVE
"""The protocol ``Efficiency.frontend_chunk_s`` was derived with (``vllm bench serve``)."""

STREAM_WORK: Mapping[ClientProtocol, StreamWork] = MappingProxyType(
    {
        REFERENCE: StreamWork(
            64e-6,
            0.0,
            "the saturated API server of the 7B grid's 128/128 at c=128 (vllm bench serve: "
            "0.77 x 128 chunks per 6.33 ms engine step; docs/validation.md, 'The API-server "
            "model'); per-token work not separated from it",
        ),
        ClientProtocol("chat", False): StreamWork(
            64e-6,
            0.0,
            "the completions cost, not separated: see ClientProtocol('chat', True)",
        ),
        ClientProtocol("chat", True): StreamWork(
            64e-6,
            0.0,
            "the completions cost, held out on the real-GPU fleets that streamed chat with "
            "usage on every chunk (tests/test_real_gpu.py). A saturated server's accounting "
            "gives about 200 us at 160 streams for both chat protocols (204 us with per-chunk "
            "usage, 198 us without: benchmarks/real_vllm/fit_client_protocol.py), but the same "
            "replica at 64 streams kept up with 1.01 tokens per chunk, which 200 us a chunk "
            "would not: a constant per-chunk cost does not hold across loads",
        ),
        ClientProtocol("completions", True): StreamWork(
            64e-6,
            0.0,
            "the completions cost: not measured with per-chunk usage",
        ),
    }
)


def stream_work(eff: Efficiency, protocol: ClientProtocol) -> tuple[float, float]:
    """(per chunk, per token) API-server CPU seconds of ``protocol`` on ``eff``'s host."""
    work = STREAM_WORK[protocol]
    scale = eff.frontend_chunk_s / STREAM_WORK[REFERENCE].chunk_s
    return work.chunk_s * scale, work.token_s * scale
