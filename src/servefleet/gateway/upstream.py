"""The gateway's one HTTP/1.1 client: one asyncio ``Protocol`` per upstream connection
(plain TCP or TLS), a keep-alive pool per replica, and callbacks instead of a reader task.

Every token of every stream passes here, so nothing on the way is a coroutine: the bytes the
kernel hands to ``data_received`` are de-chunked and given to the sink (the attempt) in the
same call, which writes them to the client's socket. aiohttp's client does the same work with
a parser object, a ``StreamReader`` and a task wake-up per read: with it the gateway spent
1.6-2.5 x the CPU per streamed token (docs/gateway.md). Requests of the gateway's own
(health checks, scrapes, /tokenize) use ``UpstreamPool.fetch``, on the same connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

MAX_HEAD_BYTES = 64 << 10
"""Largest response head (and largest block of chunked trailers) accepted."""
MAX_LINE_BYTES = 8 << 10
"""Largest chunk-size line (size and extensions) accepted."""
_HEX_DIGITS = b"0123456789abcdefABCDEF"
_NO_BODY_STATUS = frozenset((204, 304))
KEEPALIVE = 4.0
"""Seconds an idle connection is kept for reuse by default: below uvicorn's 5 s (vLLM's
server), so that no request is sent on a connection the server is closing."""
_HEAD, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILER, _LENGTH, _UNTIL_CLOSE, _IDLE = range(8)


class UpstreamError(ConnectionError):
    """The upstream connection failed or broke the protocol."""


def chunk_size(line: bytes) -> int:
    """The size on a chunk-size line. Rule: 1 to 16 hex digits, then optional whitespace and
    ``;extensions`` (RFC 9112 7.1); anything else (signs, ``0x``, underscores, an empty size)
    is a protocol error, never a size ``int()`` happens to accept."""
    size = line.split(b";", 1)[0].rstrip(b" \t")
    if not size or len(size) > 16 or size.translate(None, _HEX_DIGITS):
        raise UpstreamError(f"bad chunk size {bytes(line[:40])!r}")
    return int(size, 16)


def content_length(value: str) -> int:
    """A ``Content-Length`` value. Rule: ASCII digits; a list of equal values (repeated
    headers, joined) is that value; anything else is a protocol error (RFC 9110 8.6)."""
    values = {v.strip() for v in value.split(",")}
    if len(values) != 1:
        raise UpstreamError(f"conflicting Content-Length {value[:80]!r}")
    (v,) = values
    if not (v.isascii() and v.isdigit()):
        raise UpstreamError(f"bad Content-Length {value[:80]!r}")
    return int(v)


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
        self.server_keepalive: float | None = None
        """The server's ``Keep-Alive: timeout=`` (seconds), when it sends one."""
        self.idle_until = 0.0
        """Loop time after which this idle connection is not reused."""
        self.reused = False
        """The request on it now is not its first."""
        self.received = 0
        """Bytes received for the request on it now."""
        self.bodiless = False
        """The request was a HEAD: its answer has no body whatever its head says."""

    # -- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: BaseException | None) -> None:
        self.transport = None
        self.pool.forget(self)
        sink, self.sink = self.sink, None
        if sink is None:
            return
        if self.state == _UNTIL_CLOSE and exc is None:
            sink.on_end()
        else:
            sink.on_error(exc or UpstreamError("the replica closed the connection"))

    def data_received(self, data: bytes) -> None:
        self.received += len(data)
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
        self.received = 0
        self.buf.clear()
        self.keep_alive = True
        self.bodiless = head.startswith(b"HEAD ")
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
            size = chunk_size(data[pos:i])
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
                if i < 0 or i > MAX_HEAD_BYTES:
                    if len(buf) > MAX_HEAD_BYTES:
                        raise UpstreamError("response head too large")
                    return
                raw = bytes(buf[:i])
                del buf[: i + 4]
                self._head(raw)
            elif st == _CHUNK_SIZE:
                i = buf.find(b"\r\n")
                if i < 0 or i > MAX_LINE_BYTES:
                    if len(buf) > MAX_LINE_BYTES:
                        raise UpstreamError("chunk-size line too long")
                    return
                size = chunk_size(bytes(buf[:i]))
                del buf[: i + 2]
                if size:
                    self.need, self.state = size, _CHUNK_DATA
                else:
                    self.need, self.state = 0, _TRAILER
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
            elif st == _TRAILER:  # need: trailer bytes so far
                i = buf.find(b"\r\n")
                if i < 0 or self.need + i > MAX_HEAD_BYTES:
                    if self.need + len(buf) > MAX_HEAD_BYTES:
                        raise UpstreamError("chunked trailers too large")
                    return
                del buf[: i + 2]
                self.need += i + 2
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
            else:  # _UNTIL_CLOSE
                if buf:
                    data = bytes(buf)
                    buf.clear()
                    self.sink.on_data(data)
                return

    def _head(self, raw: bytes) -> None:
        lines = raw.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or parts[0] not in ("HTTP/1.1", "HTTP/1.0"):
            raise UpstreamError(f"not an HTTP/1.x response: {lines[0][:80]!r}")
        code = parts[1]
        if not (len(code) == 3 and code.isascii() and code.isdigit()):
            raise UpstreamError(f"bad status line {lines[0][:80]!r}")
        status = int(code)
        if status < 200:
            if status == 101:  # never asked for
                raise UpstreamError("the replica switched protocols")
            return  # an interim answer (100 Continue, 103 Early Hints): the real one follows
        headers: dict[str, str] = {}
        for line in lines[1:]:
            k, sep, v = line.partition(":")
            if sep:
                k, v = k.strip().lower(), v.strip()
                headers[k] = f"{headers[k]}, {v}" if k in headers else v
        tokens = {t.strip() for t in headers.get("connection", "").lower().split(",")}
        if "close" in tokens or parts[0] == "HTTP/1.0":
            self.keep_alive = False
        if "keep-alive" in headers:
            self.server_keepalive = keepalive_timeout(headers["keep-alive"])
        codings = headers.get("transfer-encoding")
        if self.bodiless or status in _NO_BODY_STATUS:
            self.need, self.state = 0, _LENGTH
        elif codings is not None:  # RFC 9112 6.3: chunked only as the last coding
            if codings.rsplit(",", 1)[-1].strip().lower() == "chunked":
                self.state = _CHUNK_SIZE
            else:
                self.keep_alive = False
                self.state = _UNTIL_CLOSE
        elif "content-length" in headers:
            self.need = content_length(headers["content-length"])
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


@dataclass(slots=True)
class Reply:
    """A whole (small) answer, for the gateway's own requests."""

    status: int
    headers: dict[str, str]
    body: bytes


class _Collect:
    """A sink that keeps a whole answer (up to ``limit`` bytes) and resolves a future."""

    __slots__ = ("body", "done", "headers", "limit", "status")

    def __init__(self, done: asyncio.Future[Reply], limit: int) -> None:
        self.done, self.limit = done, limit
        self.status, self.headers, self.body = 0, {}, bytearray()

    def on_head(self, status: int, headers: dict[str, str]) -> None:
        self.status, self.headers = status, headers

    def on_data(self, data: bytes) -> None:
        if self.done.done():
            return
        self.body += data
        if len(self.body) > self.limit:
            self.on_error(UpstreamError(f"answer larger than {self.limit} bytes"))

    def on_end(self) -> None:
        if not self.done.done():
            self.done.set_result(Reply(self.status, self.headers, bytes(self.body)))

    def on_error(self, exc: BaseException) -> None:
        if not self.done.done():
            self.done.set_exception(exc)


def tls_context(verify: bool | str) -> ssl.SSLContext:
    """``True``: the system's CAs; a path: that CA bundle; ``False``: no verification."""
    if verify is False:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    return ssl.create_default_context(cafile=verify if isinstance(verify, str) else None)


class UpstreamPool:
    """Keep-alive connections to one replica (``http://`` or ``https://`` base URL)."""

    def __init__(
        self,
        url: str,
        connect_timeout: float,
        tls: bool | str = True,
        keepalive: float = KEEPALIVE,
    ) -> None:
        u = urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"replica url {url!r}: expected http(s)://host[:port][/prefix]")
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.host_header = u.netloc
        self.path_prefix = u.path.rstrip("/")
        self.ssl = tls_context(tls) if u.scheme == "https" else None
        self.connect_timeout = connect_timeout
        self.keepalive = keepalive
        """Seconds an idle connection is kept for reuse (less when the server says so)."""
        self.stale_retries = 0
        """Requests sent again on a new connection after a reused one was closed before
        any byte of the answer (the server closed it as it went idle)."""
        self._idle: list[UpstreamConnection] = []
        self._all: set[UpstreamConnection] = set()

    async def acquire(self, fresh: bool = False) -> UpstreamConnection:
        """An idle connection that the server is not about to close, else a new one (always a
        new one when ``fresh``)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        while self._idle and not fresh:
            c = self._idle.pop()
            if c.usable and now < c.idle_until:
                c.reused = True
                return c
            c.close()
        async with asyncio.timeout(self.connect_timeout):
            _, conn = await loop.create_connection(
                lambda: UpstreamConnection(self),
                self.host,
                self.port,
                ssl=self.ssl,
                server_hostname=self.host if self.ssl else None,
            )
        self._all.add(conn)
        return conn

    def head(self, method: str, path: str, headers: dict[str, str], length: int) -> bytes:
        return request_head(method, self.host_header, self.path_prefix + path, headers, length)

    async def fetch(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        timeout: float = 2.0,
        limit: int = 16 << 20,
    ) -> Reply:
        """One whole request and answer within ``timeout`` s (connecting included). Raises
        ``OSError`` (``UpstreamError``) or ``TimeoutError``; the connection of a request
        that timed out is closed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        h = {"Content-Type": "application/json", **(headers or {})} if body else headers or {}
        head = self.head(method, path, h, len(body))
        fresh = False
        while True:
            async with asyncio.timeout_at(deadline):
                conn = await self.acquire(fresh)
            done: asyncio.Future[Reply] = loop.create_future()
            conn.send(head, body, _Collect(done, limit))
            try:
                async with asyncio.timeout_at(deadline):
                    return await done
            except TimeoutError:
                conn.close()
                raise
            except OSError:
                conn.close()
                if not self.stale(conn, fresh):
                    raise
                fresh = True
            except BaseException:
                conn.close()
                raise

    def stale(self, conn: UpstreamConnection, fresh: bool) -> bool:
        """Whether a request that failed on ``conn`` goes once more on a new connection: the
        connection was reused and closed before any byte of the answer (the server closed it
        as it went idle: the request was never read), and it was not the retry already."""
        if fresh or not conn.reused or conn.received:
            return False
        self.stale_retries += 1
        return True

    def release(self, conn: UpstreamConnection) -> None:
        if conn.usable:
            keep = self.keepalive
            if conn.server_keepalive is not None:  # a second's margin before the server's
                keep = min(keep, conn.server_keepalive - min(1.0, conn.server_keepalive / 2))
            conn.idle_until = asyncio.get_running_loop().time() + keep
            self._idle.append(conn)

    def forget(self, conn: UpstreamConnection) -> None:
        self._all.discard(conn)
        with contextlib.suppress(ValueError):
            self._idle.remove(conn)

    def close(self) -> None:
        for c in list(self._all):
            c.close()
        self._idle.clear()


def keepalive_timeout(value: str) -> float | None:
    """The ``timeout=`` of a ``Keep-Alive`` header (``timeout=5, max=100``), or None."""
    for part in value.split(","):
        k, _, v = part.strip().partition("=")
        if k.strip().lower() == "timeout":
            try:
                t = float(v.strip())
            except ValueError:
                return None
            return t if t >= 0 else None
    return None


def request_head(method: str, host: str, path: str, headers: dict[str, str], length: int) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {length}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
