"""Server-sent events of OpenAI streams, as the relay needs them.

The relay forwards whole events only (it cuts the upstream bytes at the last blank line), and
keeps the bytes it forwarded. Nothing is parsed on that path; only when a replica fails in the
middle of a stream does ``StreamLog.summary`` read back what the client already has, and the
events of the continuing replica pass through ``Resumed.rewrite``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

DONE = b"data: [DONE]"


def events(data: bytes) -> list[bytes]:
    """The events (without the blank line) in whole-event bytes."""
    return [e for e in data.split(b"\n\n") if e.strip()]


@dataclass(slots=True)
class StreamSummary:
    text: str
    """Output text of choice 0 that the client has."""
    content_events: int
    """Events that carried output text."""
    finish_reason: str | None
    done: bool
    """``data: [DONE]`` was sent."""
    usage_sent: bool


class StreamLog:
    """The bytes sent to the client in one streamed response, up to ``limit`` of them (a
    stream that cannot resume keeps none: ``limit`` 0)."""

    __slots__ = ("chunks", "kept", "limit", "size")

    def __init__(self, limit: int = 1 << 62) -> None:
        self.chunks: list[bytes] = []
        self.limit = limit
        self.size = 0
        self.kept = limit > 0
        """Every byte sent is here (what a resumption needs)."""

    def add(self, data: bytes) -> None:
        self.size += len(data)
        if self.kept:
            if self.size > self.limit:
                self.kept = False
                self.chunks.clear()
            else:
                self.chunks.append(data)

    @property
    def started(self) -> bool:
        return self.size > 0

    def summary(self) -> StreamSummary:
        parts: list[str] = []
        n = 0
        finish = None
        done = usage = False
        for ev in events(b"".join(self.chunks)):
            if ev.startswith(DONE):
                done = True
                continue
            obj = _data(ev)
            if obj is None:
                continue
            choices = obj.get("choices") or []
            if not choices and obj.get("usage"):
                usage = True
            for c in choices:
                if c.get("index", 0) != 0:
                    continue
                delta = c.get("delta")
                piece = (delta or {}).get("content") if delta is not None else c.get("text")
                if piece:
                    parts.append(piece)
                    n += 1
                if c.get("finish_reason"):
                    finish = c["finish_reason"]
        return StreamSummary("".join(parts), n, finish, done, usage)


def _data(ev: bytes) -> dict | None:
    for line in ev.split(b"\n"):
        if line.startswith(b"data:"):
            try:
                obj = json.loads(line[5:])
            except ValueError:
                return None
            return obj if isinstance(obj, dict) else None
    return None


class Resumed:
    """Rewrites the events of a continuation so that the client sees one stream: the role-only
    first chunk of a chat continuation is dropped (the client has it), and the usage chunk
    counts the original prompt and all the output."""

    __slots__ = ("chat", "tokens_before")

    def __init__(self, chat: bool, tokens_before: int) -> None:
        self.chat = chat
        self.tokens_before = tokens_before

    def rewrite(self, ev: bytes) -> bytes | None:
        if ev.startswith(DONE):
            return ev
        if self.chat and b'"role"' in ev:
            obj = _data(ev)
            if obj is not None:
                for c in obj.get("choices") or []:
                    delta = c.get("delta") or {}
                    delta.pop("role", None)
                    if not delta.get("content") and not c.get("finish_reason"):
                        return None
                return b"data: " + json.dumps(obj, separators=(",", ":")).encode()
        if b'"choices":[]' in ev and b'"usage"' in ev:
            obj = _data(ev)
            u = (obj or {}).get("usage")
            if isinstance(u, dict) and isinstance(u.get("prompt_tokens"), int):
                k = self.tokens_before
                u["prompt_tokens"] -= k
                u["completion_tokens"] = u.get("completion_tokens", 0) + k
                return b"data: " + json.dumps(obj, separators=(",", ":")).encode()
        return ev
