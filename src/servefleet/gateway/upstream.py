"""A lean HTTP/1.1 client for the streaming hot path: one asyncio ``Protocol`` per upstream
connection, a keep-alive pool per replica, and callbacks instead of a reader task.

Every token of every stream passes here, so nothing on the way is a coroutine: the bytes the
kernel hands to ``data_received`` are de-chunked and given to the sink (the relay) in the same
call, which writes them to the client's socket. aiohttp's client does the same work with a
parser object, a ``StreamReader`` and a task wake-up per read; this path costs a fraction of
that per chunk. Everything else (non-streaming requests, health checks, scrapes, /tokenize)
uses aiohttp's client.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Protocol

MAX_HEAD_BYTES = 64 << 10
_HEAD, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILER, _LENGTH, _UNTIL_CLOSE, _IDLE = range(8)


class UpstreamError(ConnectionError):
    """The upstream connection failed or broke the protocol."""


class Sink(Protocol):
    def on_head(self, status: int, headers: dict[str, str]) -> None: ...

    def on_data(self, data: bytes) -> None: ...

    def on_end(self) -> None: ...

    def on_error(self, exc: BaseException) -> None: ...


class UpstreamConnection(asyncio.Protocol):
    """One connection: send a request, feed the response to a sink, then back to the pool."""

    def __init__(self, pool: UpstreamPool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.sink: Sink | None = None
        self.state = _IDLE
        self.buf = bytearray()
        self.need = 0
        self.keep_alive = True

    # -- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: BaseException | None) -> None:
        self.transport = None
        self.pool.forget(self)
        sink, self.sink = self.sink, None
        if sink is None:
            return
        if self.state == _UNTIL_CLOSE:
            sink.on_end()
        else:
            sink.on_error(exc or UpstreamError("the replica closed the connection"))

    def data_received(self, data: bytes) -> None:
        sink = self.sink
        if sink is None:  # nothing asked for: a broken server
            self.close()
            return
        try:
            if self.state == _CHUNK_SIZE and not self.buf:
                data = self._whole_chunks(data, sink)
                if not data:
                    return
            self.buf += data
            self._parse()
        except UpstreamError as exc:
            sink, self.sink = self.sink, None
            self.close()
            if sink is not None:
                sink.on_error(exc)

    # -- use -------------------------------------------------------------------------------
    @property
    def usable(self) -> bool:
        return (
            self.transport is not None and not self.transport.is_closing() and self.state == _IDLE
        )

    def send(self, head: bytes, body: bytes, sink: Sink) -> None:
        assert self.transport is not None
        self.sink = sink
        self.state = _HEAD
        self.buf.clear()
        self.keep_alive = True
        self.transport.write(head + body)

    def pause(self) -> None:
        if self.transport is not None:
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.transport is not None:
            self.transport.resume_reading()

    def close(self) -> None:
        """Abandon the connection (and the request on it, if any: the replica aborts it)."""
        self.sink = None
        if self.transport is not None:
            self.transport.close()

    # -- the response ----------------------------------------------------------------------
    def _whole_chunks(self, data: bytes, sink: Sink) -> bytes:
        """The common case of a stream: ``data`` holds whole chunks; hand them over without
        copying them through the buffer (the events of one read in one call). Returns what is
        left for the general parser."""
        pos, n = 0, len(data)
        out = []
        while pos < n:
            i = data.find(b"\r\n", pos)
            if i < 0:
                break
            try:
                size = int(data[pos:i].split(b";", 1)[0], 16)
            except ValueError:
                raise UpstreamError("bad chunk size") from None
            end = i + 2 + size
            if size == 0 or end + 2 > n:
                break
            if data[end : end + 2] != b"\r\n":
                raise UpstreamError("bad chunk end")
            out.append(data[i + 2 : end])
            pos = end + 2
        if out:
            sink.on_data(out[0] if len(out) == 1 else b"".join(out))
        return data[pos:] if pos else data

    def _parse(self) -> None:
        buf = self.buf
        while self.sink is not None:
            st = self.state
            if st == _HEAD:
                i = buf.find(b"\r\n\r\n")
                if i < 0:
                    if len(buf) > MAX_HEAD_BYTES:
                        raise UpstreamError("response head too large")
                    return
                self._head(bytes(buf[:i]))
                del buf[: i + 4]
            elif st == _CHUNK_SIZE:
                i = buf.find(b"\r\n")
                if i < 0:
                    return
                try:
                    size = int(bytes(buf[:i]).split(b";", 1)[0], 16)
                except ValueError:
                    raise UpstreamError("bad chunk size") from None
                del buf[: i + 2]
                if size:
                    self.need, self.state = size, _CHUNK_DATA
                else:
                    self.state = _TRAILER
            elif st == _CHUNK_DATA:
                if not buf:
                    return
                n = min(self.need, len(buf))
                data = bytes(buf[:n])
                del buf[:n]
                self.need -= n
                if not self.need:
                    self.state = _CHUNK_END
                self.sink.on_data(data)
            elif st == _CHUNK_END:
                if len(buf) < 2:
                    return
                if buf[:2] != b"\r\n":
                    raise UpstreamError("bad chunk end")
                del buf[:2]
                self.state = _CHUNK_SIZE
            elif st == _TRAILER:
                i = buf.find(b"\r\n")
                if i < 0:
                    return
                del buf[: i + 2]
                if i == 0:
                    self._finish()
            elif st == _LENGTH:
                if self.need == 0:
                    self._finish()
                    continue
                if not buf:
                    return
                n = min(self.need, len(buf))
                data = bytes(buf[:n])
                del buf[:n]
                self.need -= n
                self.sink.on_data(data)
            elif st == _UNTIL_CLOSE:
                if buf:
                    data = bytes(buf)
                    buf.clear()
                    self.sink.on_data(data)
                return
            else:
                return

    def _head(self, raw: bytes) -> None:
        lines = raw.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
            raise UpstreamError(f"not an HTTP/1.x response: {lines[0][:80]!r}")
        try:
            status = int(parts[1])
        except ValueError:
            raise UpstreamError(f"bad status line {lines[0][:80]!r}") from None
        headers: dict[str, str] = {}
        for line in lines[1:]:
            k, sep, v = line.partition(":")
            if sep:
                headers[k.strip().lower()] = v.strip()
        if headers.get("connection", "").lower() == "close" or parts[0] == "HTTP/1.0":
            self.keep_alive = False
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self.state = _CHUNK_SIZE
        elif "content-length" in headers:
            self.need = int(headers["content-length"])
            self.state = _LENGTH
        else:
            self.keep_alive = False
            self.state = _UNTIL_CLOSE
        assert self.sink is not None
        self.sink.on_head(status, headers)

    def _finish(self) -> None:
        sink, self.sink = self.sink, None
        self.state = _IDLE
        if self.keep_alive and not self.buf:
            self.pool.release(self)
        else:
            self.close()
        if sink is not None:
            sink.on_end()


class UpstreamPool:
    """Keep-alive connections to one ``host:port``."""

    def __init__(self, host: str, port: int, connect_timeout: float) -> None:
        self.host = host
        self.port = port
        self.connect_timeout = connect_timeout
        self._idle: list[UpstreamConnection] = []
        self._all: set[UpstreamConnection] = set()

    async def acquire(self) -> UpstreamConnection:
        while self._idle:
            c = self._idle.pop()
            if c.usable:
                return c
        loop = asyncio.get_running_loop()
        _, conn = await asyncio.wait_for(
            loop.create_connection(lambda: UpstreamConnection(self), self.host, self.port),
            self.connect_timeout,
        )
        self._all.add(conn)
        return conn

    def release(self, conn: UpstreamConnection) -> None:
        if conn.usable:
            self._idle.append(conn)

    def forget(self, conn: UpstreamConnection) -> None:
        self._all.discard(conn)
        with contextlib.suppress(ValueError):
            self._idle.remove(conn)

    def close(self) -> None:
        for c in list(self._all):
            c.close()
        self._idle.clear()


def request_head(method: str, host: str, path: str, headers: dict[str, str], length: int) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {length}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
