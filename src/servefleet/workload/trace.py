"""Replaying a trace: each record is one request at its recorded time.

Open loop: record i arrives at (timestamp_i - timestamp_0) · scale. Closed loop (``concurrency``
N): the first N records start at t=0 and each finish starts the next record, timestamps ignored;
the replay ends with the trace. Ids are ``r<index>`` in timestamp order.

Prompts: a record with ``prefix_group`` starts with the shared segment ``pfx:<group>:<tokens>``.
A record with a ``session_id`` whose previous record in that session fits inside it (prompt_tokens
>= previous prompt + previous output) resends that history (previous prompt, then its answer, then
the new tokens); the answer has the length the trace recorded for it. A record with ``blocks``
(Mooncake's ``hash_ids``) is its blocks, ``Segment("h:<hash>", block_size or what is left,
"block")`` each, then its tokens past the last block, if any, as its own ``user`` segment: equal
hashes are equal tokens, shared by any request that has them, with no session.
"""

from __future__ import annotations

from collections.abc import Iterator

from servefleet.tokens import user_key

from .datasets import MOONCAKE_BLOCK_TOKENS, TraceRecord
from .types import RequestSpec, Segment, output_key


class TraceSource:
    def __init__(
        self,
        records: list[TraceRecord],
        *,
        scale: float = 1.0,
        concurrency: int | None = None,
        block_size: int = MOONCAKE_BLOCK_TOKENS,
    ):
        self._records = records
        self._block_size = block_size
        self._scale = scale
        self._concurrency = concurrency
        self._next = 0
        self._history: dict[str, tuple[tuple[Segment, ...], str, int]] = {}

    def initial(self) -> Iterator[RequestSpec]:
        self._next, self._history = 0, {}
        if self._concurrency is not None:
            n = min(self._concurrency, len(self._records))
            return iter([self._take(0.0) for _ in range(n)])
        return self._open()

    def _open(self) -> Iterator[RequestSpec]:
        t0 = self._records[0].timestamp
        while self._next < len(self._records):
            yield self._take((self._records[self._next].timestamp - t0) * self._scale)

    def on_finish(
        self, spec: RequestSpec, finish_time: float, output_tokens: int
    ) -> list[RequestSpec]:
        if self._concurrency is None or self._next >= len(self._records):
            return []
        return [self._take(finish_time)]

    def _take(self, arrival_time: float) -> RequestSpec:
        i, rec = self._next, self._records[self._next]
        self._next += 1
        rid = f"r{i:06d}"
        prompt = self._prompt(rec, rid)
        if rec.session_id is not None:
            self._history[rec.session_id] = (prompt, rid, rec.output_tokens)
        return RequestSpec(
            request_id=rid,
            class_name="trace",
            prompt=prompt,
            max_tokens=rec.output_tokens,
            arrival_time=arrival_time,
            session_id=rec.session_id,
            user_id=rec.session_id,
        )

    def _prompt(self, rec: TraceRecord, rid: str) -> tuple[Segment, ...]:
        if rec.blocks:
            return self._blocks(rec, rid)
        prev = self._history.get(rec.session_id) if rec.session_id is not None else None
        if prev is not None:
            p_prompt, p_id, p_out = prev
            rest = rec.prompt_tokens - sum(s.length for s in p_prompt) - p_out
            if rest >= 0:
                answer = Segment(output_key(p_id), p_out, "answer")
                return (*p_prompt, answer, Segment(user_key(rid), rest, "user"))
        user = Segment(user_key(rid), rec.prompt_tokens - rec.prefix_tokens, "user")
        if rec.prefix_group is None or rec.prefix_tokens == 0:
            return (user,)
        key = f"pfx:{rec.prefix_group}:{rec.prefix_tokens}"
        return (Segment(key, rec.prefix_tokens, "system"), user)

    def _blocks(self, rec: TraceRecord, rid: str) -> tuple[Segment, ...]:
        size, n = self._block_size, rec.prompt_tokens
        out = [
            Segment(f"h:{h}", min(size, n - i * size), "block")
            for i, h in enumerate(rec.blocks)
            if i * size < n
        ]
        rest = n - len(rec.blocks) * size
        if rest > 0:
            out.append(Segment(user_key(rid), rest, "user"))
        return tuple(out)


def native_rate(records: list[TraceRecord]) -> float | None:
    """Requests per second of the trace as recorded (None if it spans no time)."""
    span = records[-1].timestamp - records[0].timestamp
    return (len(records) - 1) / span if span > 0 else None
