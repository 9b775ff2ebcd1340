"""A scripted HTTP/1.1 server on loopback, in a thread of its own: each request is answered
with the bytes a script returns (any framing, cut anywhere), or its connection is closed
unanswered. For the gateway's upstream client and for replicas that misbehave on purpose."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Seen:
    conn: int
    """Which connection (0, 1, ... in the order they were made)."""
    nth: int
    """Which request on that connection (0: its first)."""
    method: str
    path: str
    body: bytes
    headers: dict[str, str]
    """Header names in lower case."""


Script = Callable[[Seen], "list[bytes] | None"]
"""What to write for a request, as pieces written one by one (None: close at once)."""


class ScriptedUpstream:
    def __init__(self, script: Script) -> None:
        self.script = script
        self.seen: list[Seen] = []
        self.connections = 0
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ScriptedUpstream:
        self._thread.start()
        assert self._ready.wait(10), "the scripted upstream did not start"
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._main())
        self._loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        await self._stop.wait()
        server.close()
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in others:
            t.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = self.connections
        self.connections += 1
        nth = 0
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    k, _, v = line.partition(":")
                    if k.strip():
                        headers[k.strip().lower()] = v.strip()
                length = int(headers.get("content-length", "0"))
                body = await reader.readexactly(length) if length else b""
                seen = Seen(conn, nth, method, path, body, headers)
                self.seen.append(seen)
                nth += 1
                pieces = self.script(seen)
                if pieces is None:
                    return
                for p in pieces:
                    writer.write(p)
                    await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()


def json_answer(obj: object, status: int = 200, extra: str = "") -> bytes:
    body = json.dumps(obj).encode()
    return (
        f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body


def sse_answer(events: list[str]) -> bytes:
    """A chunked ``text/event-stream`` answer, one chunk per event, ``[DONE]`` at the end."""
    out = [
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    ]
    for e in [*events, "[DONE]"]:
        data = f"data: {e}\n\n".encode()
        out.append(b"%x\r\n%s\r\n" % (len(data), data))
    out.append(b"0\r\n\r\n")
    return b"".join(out)


def replica_script(model: str, close_reused: bool = False) -> Script:
    """A minimal vLLM: /health, /v1/models, and completions that answer "a b c" (streamed when
    asked). ``close_reused``: a request that is not the first on its connection finds it
    closed unanswered (a server closing an idle keep-alive connection as the request came)."""

    def script(s: Seen) -> list[bytes] | None:
        if close_reused and s.nth > 0:
            return None
        if s.path == "/health":
            return [json_answer({})]
        if s.path == "/v1/models":
            return [json_answer({"data": [{"id": model, "max_model_len": 4096}]})]
        if s.path == "/v1/completions":
            req = json.loads(s.body)
            if req.get("stream"):
                words = [" a", " b", " c"]
                chunks = [
                    json.dumps({"choices": [{"index": 0, "text": w, "finish_reason": None}]})
                    for w in words
                ]
                return [sse_answer(chunks)]
            return [json_answer({"choices": [{"index": 0, "text": " a b c"}]})]
        return [json_answer({"error": {"message": "not found"}}, 404)]

    return script
