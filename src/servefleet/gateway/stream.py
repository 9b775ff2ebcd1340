"""The client's side of a streamed answer: what it has been sent, and how to go on.

``StreamState`` owns the client's response once its headers are out. Events reach it whole
(cut at the last blank line of what a replica sent); after the first write they go straight
to the client's socket in chunked framing (``push``, called from the upstream connection's
callback: no task switch per event). It keeps the bytes it sent, so that when a replica
fails mid-way it can say what the client already has and build the request that continues
from there on another replica (``resume_request``), whose events it then rewrites so that
the client sees one stream (``sse.Resumed``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

from aiohttp import web

from servefleet.gateway.errors import GatewayError
from servefleet.gateway.parse import CHAT, ParsedRequest, resume_body
from servefleet.gateway.sse import DONE, Resumed, StreamLog

DONE_EVENT = DONE + b"\n\n"
WRITE_HIGH_WATER = 1 << 18
"""Bytes waiting in the client socket's buffer above which events wait for it to drain."""

CountTokens = Callable[[str], Awaitable[int | None]]


class ClientGone(Exception):
    """The client closed its connection."""


class ClientTooSlow(ClientGone):
    """The client did not read its stream for ``write_timeout`` s: the gateway closed it."""


class StreamState:
    __slots__ = ("done_seen", "log", "out", "request", "resumed", "transport", "write_timeout")

    def __init__(
        self, request: web.Request, write_timeout: float = 30.0, log_limit: int = 1 << 62
    ) -> None:
        self.request = request
        self.write_timeout = write_timeout
        """Seconds a write may wait for the client to read before the stream is closed."""
        self.out: web.StreamResponse | None = None
        self.transport = None
        self.log = StreamLog(log_limit)
        """What the client was sent, for a resumption (``log_limit`` bytes at most)."""
        self.resumed: Resumed | None = None
        self.done_seen = False

    @property
    def open(self) -> bool:
        """The response's headers are out: failures end it with an error event, not a 502."""
        return self.out is not None

    @property
    def has_events(self) -> bool:
        """The client has part of the stream: a failure now means resuming."""
        return self.log.started

    async def start(self, headers: dict[str, str]) -> None:
        """Send the stream's headers (before its first event, as Nginx does)."""
        resp = web.StreamResponse(
            status=200,
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
                **headers,
            },
        )
        try:
            await resp.prepare(self.request)
            await resp.write(b"")  # aiohttp holds the headers back until a write
        except (ConnectionError, RuntimeError) as exc:
            raise ClientGone(str(exc)) from None
        self.out = resp
        self.transport = self.request.transport

    def take(self, data: bytes) -> bytes:
        """Events about to go to the client: a continuation's rewritten, logged, [DONE] noted."""
        if self.resumed is not None:
            kept = []
            for ev in data.split(b"\n\n"):
                if ev.strip():
                    ev2 = self.resumed.rewrite(ev)
                    if ev2 is not None:
                        kept.append(ev2 + b"\n\n")
            data = b"".join(kept)
            if not data:
                return data
        if data.endswith(DONE_EVENT):
            self.done_seen = True
        self.log.add(data)
        return data

    def push(self, data: bytes) -> bool:
        """Write ``data`` (already ``take``n) straight to the client's socket, framed as one
        chunk; False when the socket's buffer is full (then ``write`` it)."""
        tr = self.transport
        if tr is None or tr.is_closing():
            raise ClientGone("the client closed the connection")
        if tr.get_write_buffer_size() >= WRITE_HIGH_WATER:
            return False
        tr.write(b"%x\r\n%s\r\n" % (len(data), data))
        return True

    async def write(self, data: bytes) -> None:
        """Write through aiohttp's writer (which waits for the socket to drain), for at most
        ``write_timeout`` s: a client that does not read then loses its stream (its
        connection is closed), and only it."""
        assert self.out is not None
        await self._bounded(self.out.write(data))

    async def _bounded(self, write) -> None:
        try:
            async with asyncio.timeout(self.write_timeout):
                await write
        except TimeoutError:
            tr = self.transport or self.request.transport
            if tr is not None:
                tr.abort()
            raise ClientTooSlow(
                f"the client read nothing for {self.write_timeout:g} s (stream.write_timeout)"
            ) from None
        except (ConnectionError, RuntimeError) as exc:
            raise ClientGone(str(exc)) from None

    async def finish(self) -> web.StreamResponse:
        """End the stream (adding ``[DONE]`` if no replica sent it)."""
        out = self.out
        assert out is not None
        if not self.done_seen:
            self.done_seen = True
            await self._bounded(out.write(DONE_EVENT))
        await self._bounded(out.write_eof())
        return out

    async def fail(self, message: str) -> web.StreamResponse:
        """End the stream with an error event and ``[DONE]``: never a hang."""
        err = GatewayError(502, message, "upstream_failed_mid_stream")
        out = self.out
        assert out is not None
        await self._bounded(out.write(err.sse_event() + DONE_EVENT))
        self.done_seen = True
        await self._bounded(out.write_eof())
        return out

    def finished(self) -> bool:
        """The client has the whole answer (a finish reason or ``[DONE]``)."""
        s = self.log.summary()
        return s.done or s.finish_reason is not None

    async def resume_request(self, parsed: ParsedRequest, count: CountTokens) -> bytes | None:
        """The body that continues the stream on another replica from what the client has
        (None: nothing is left to generate). ``count`` tokenizes with that replica."""
        summ = self.log.summary()
        n = await count(summ.text) if summ.text else 0
        if n is None:
            n = summ.content_events
        if parsed.max_tokens is not None and n >= parsed.max_tokens:
            return None
        self.resumed = Resumed(parsed.kind == CHAT, n)
        self.done_seen = False
        return json.dumps(resume_body(parsed, summ.text, n)).encode()
