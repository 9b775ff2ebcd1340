"""The gateway's HTTP/1.1 client (gateway/upstream.py) against a scripted upstream over loopback.

The upstream is a real server that answers each request with scripted bytes, written in pieces
cut at arbitrary offsets, so the client's parser sees every framing split anywhere: chunked
bodies (chunk-size lines, extensions and trailers cut), Content-Length bodies in pieces,
read-until-close, ``Connection: close``, HTTP/1.0, interim 1xx answers, bodiless statuses, and
broken answers. Rule: a well-formed answer is decoded exactly (and the connection reused only
when HTTP allows it); a broken one ends in ``UpstreamError``; nothing waits longer than the
caller's timeout.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servefleet.gateway.upstream import (
    MAX_HEAD_BYTES,
    MAX_LINE_BYTES,
    Reply,
    UpstreamConnection,
    UpstreamError,
    UpstreamPool,
    keepalive_timeout,
    request_head,
    tls_context,
)

TIMEOUT = 3.0
"""Bound on every exchange: a correct client finishes long before it; a hang fails the test."""


# -- the scripted upstream ---------------------------------------------------------------------
@dataclass
class Answer:
    """What the upstream writes for one request: ``pieces`` one write each (the client's reads
    see them apart), then ``then``: "keep" (wait for the next request), "close" (FIN),
    "reset" (RST), or "hold" (send nothing more, keep the connection open)."""

    pieces: list[bytes]
    then: str = "keep"


@dataclass
class Upstream:
    answers: list[Answer]
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    peer_closed: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the upstream's side of a connection ended (the client closed or reset it)."""
    got_request: asyncio.Event = field(default_factory=asyncio.Event)
    server: asyncio.base_events.Server | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aenter__(self) -> Upstream:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.answers:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length)
                self.requests.append(head + body)
                self.got_request.set()
                answer = self.answers.pop(0)
                for piece in answer.pieces:
                    writer.write(piece)
                    await writer.drain()
                    await _ticks()
                if answer.then == "close":
                    return
                if answer.then == "reset":
                    sock = writer.get_extra_info("socket")
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    writer.transport.abort()
                    return
                if answer.then == "hold":
                    await reader.read()  # until the client gives up and closes
                    return
        except ConnectionError:
            return
        finally:
            writer.close()
            self.peer_closed.set()


async def _ticks(n: int = 3) -> None:
    """Let the loop run the client's read of what was just written, so the next piece arrives
    in a read of its own (same loop, loopback, TCP_NODELAY)."""
    for _ in range(n):
        await asyncio.sleep(0)


def _cut(wire: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c for c in cuts if 0 < c < len(wire)})
    return [wire[a:b] for a, b in zip([0, *points], [*points, len(wire)], strict=True)]


class Recorder:
    """A sink that checks the callback order: one head, data, then exactly one end or error,
    nothing after it."""

    def __init__(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body = bytearray()
        self.heads = 0
        self.done: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()

    def on_head(self, status: int, headers: dict[str, str]) -> None:
        assert not self.done.done() and self.heads == 0
        self.heads += 1
        self.status, self.headers = status, headers

    def on_data(self, data: bytes) -> None:
        assert not self.done.done() and self.heads == 1 and data
        self.body += data

    def on_end(self) -> None:
        assert not self.done.done() and self.heads == 1
        self.done.set_result(None)

    def on_error(self, exc: BaseException) -> None:
        assert not self.done.done()
        self.done.set_result(exc)


# -- answers -----------------------------------------------------------------------------------
FRAMINGS = [
    "chunked",
    "length",
    "close_length",
    "close_chunked",
    "until_close",
    "http10_length",
    "http10_until_close",
    "coded_until_close",
    "bodiless",
]


@dataclass
class Wire:
    status: int
    body: bytes
    wire: bytes
    reusable: bool
    """HTTP lets the connection carry another request after this answer."""
    closes: bool
    """The upstream closes the connection after this answer."""
    events: list[int] = field(default_factory=list)
    """Offsets in ``wire`` where a chunk starts: a streaming server's writes begin there."""


def _case(draw: st.DrawFn, name: str) -> str:
    return draw(st.sampled_from([name, name.lower(), name.upper()]))


@st.composite
def answers(draw: st.DrawFn) -> Wire:
    framing = draw(st.sampled_from(FRAMINGS))
    body = draw(st.binary(max_size=600) | st.just(b"data: {}\n\n" * 40))
    if framing == "bodiless":
        status, body = draw(st.sampled_from([204, 304])), b""
    else:
        status = draw(st.sampled_from([200, 201, 400, 404, 429, 500, 503]))
    version = "HTTP/1.0" if framing.startswith("http10") else "HTTP/1.1"
    reason = draw(st.sampled_from(["", " OK", " Some Reason Phrase"]))
    headers = [f"{_case(draw, 'Content-Type')}: application/octet-stream"]
    headers += draw(
        st.lists(
            st.sampled_from(
                ["X-Extra: 1", "Server:  spaced  ", "Date: x", "Keep-Alive: timeout=5, max=9"]
            )
        )
    )
    closes = framing.startswith(("close", "until", "http10", "coded"))
    if framing.startswith("close"):
        headers.append(
            f"{_case(draw, 'Connection')}: {draw(st.sampled_from(['close', 'Close', 'keep-alive, close']))}"
        )
    elif version == "HTTP/1.1" and draw(st.booleans()):
        headers.append("Connection: keep-alive")
    events: list[int] = []
    if framing.endswith("chunked"):
        headers.append(
            f"{_case(draw, 'Transfer-Encoding')}: {draw(st.sampled_from(['chunked', 'gzip, chunked']))}"
        )
        payload, events = _chunked(draw, body)
    elif framing == "coded_until_close":  # chunked not last: the length is the connection's
        headers.append(f"Transfer-Encoding: {draw(st.sampled_from(['gzip', 'chunked, gzip']))}")
        payload = body
    elif framing.endswith("length"):
        headers.append(f"{_case(draw, 'Content-Length')}: {len(body)}")
        payload = body
    else:
        payload = body
    interim = b""
    if draw(st.booleans()) and version == "HTTP/1.1":
        interim = draw(
            st.sampled_from(
                [
                    b"HTTP/1.1 100 Continue\r\n\r\n",
                    b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n",
                ]
            )
        )
    head = f"{version} {status}{reason}\r\n" + "".join(h + "\r\n" for h in headers) + "\r\n"
    head_bytes = interim + head.encode("latin-1")
    wire = head_bytes + payload
    return Wire(status, body, wire, not closes, closes, [len(head_bytes) + e for e in events])


def _chunked(draw: st.DrawFn, body: bytes) -> tuple[bytes, list[int]]:
    """``body`` as chunks of drawn sizes (hex in either case, leading zeros, extensions),
    then trailers; and the offset where each chunk starts."""
    sizes = draw(st.lists(st.integers(1, 300), max_size=8))
    out, pos = [], 0
    for n in [*sizes, len(body)]:
        piece = body[pos : pos + n]
        if not piece:
            continue
        pos += len(piece)
        size = f"{len(piece):x}"
        size = draw(st.sampled_from([size, size.upper(), "00" + size]))
        ext = draw(st.sampled_from(["", ";a=b", ' ;name="q;x"']))
        out.append(f"{size}{ext}\r\n".encode() + piece + b"\r\n")
    trailers = draw(st.sampled_from(["", "X-Trailer: 1\r\n", "A: 1\r\nB: 2\r\n"]))
    out.append(f"0\r\n{trailers}\r\n".encode())
    starts, pos = [], 0
    for c in out:
        starts.append(pos)
        pos += len(c)
    return b"".join(out), starts


def _cuts(w: Wire) -> st.SearchStrategy[list[int]]:
    """Anywhere, or (as a streaming server writes) where chunks start, or both."""
    anywhere = st.integers(0, len(w.wire))
    if not w.events:
        return st.lists(anywhere, max_size=40)
    return st.lists(st.sampled_from(w.events), max_size=10) | st.lists(
        st.sampled_from(w.events) | anywhere, max_size=40
    )


async def _exchange(pool: UpstreamPool, method: str = "POST") -> Recorder:
    conn = await asyncio.wait_for(pool.acquire(), TIMEOUT)
    sink = Recorder()
    conn.send(pool.head(method, "/v1/x", {"X-A": "1"}, 2), b"{}", sink)
    exc = await asyncio.wait_for(sink.done, TIMEOUT)
    if exc is not None:
        raise exc
    return sink


# -- well-formed answers -----------------------------------------------------------------------
@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=answers(), second=answers(), data=st.data())
def test_every_framing_cut_anywhere_decodes_exactly_and_reuses_only_when_allowed(
    first: Wire, second: Wire, data: st.DataObject
) -> None:
    script = [
        Answer(_cut(w.wire, data.draw(_cuts(w))), "close" if w.closes else "keep")
        for w in (first, second)
    ]

    async def go() -> None:
        async with Upstream(script) as up:
            pool = UpstreamPool(up.url, connect_timeout=TIMEOUT)
            try:
                for w in (first, second):
                    got = await _exchange(pool)
                    assert got.status == w.status
                    assert bytes(got.body) == w.body
                    assert got.headers["content-type"] == "application/octet-stream"
                # the second request went on the first connection exactly when HTTP allowed it
                assert up.connections == (1 if first.reusable else 2)
                assert len(pool._idle) == (1 if second.reusable else 0)
                assert up.requests[0].startswith(b"POST /v1/x HTTP/1.1\r\n")
            finally:
                pool.close()

    asyncio.run(go())


@settings(max_examples=60, deadline=None)
@given(w=answers(), data=st.data())
def test_fetch_returns_the_whole_answer(w: Wire, data: st.DataObject) -> None:
    cuts = data.draw(_cuts(w))

    async def go() -> Reply:
        async with Upstream([Answer(_cut(w.wire, cuts), "close" if w.closes else "keep")]) as up:
            pool = UpstreamPool(up.url + "/prefix/", connect_timeout=TIMEOUT)
            try:
                reply = await pool.fetch("POST", "/tokenize", b'{"a": 1}', timeout=TIMEOUT)
            finally:
                pool.close()
            assert up.requests[0].startswith(b"POST /prefix/tokenize HTTP/1.1\r\n")
            assert b"\r\nContent-Type: application/json\r\n" in up.requests[0]
            assert up.requests[0].endswith(b'\r\n\r\n{"a": 1}')
            return reply

    reply = asyncio.run(go())
    assert (reply.status, reply.body) == (w.status, w.body)


def test_a_head_request_gets_no_body_whatever_its_content_length_says() -> None:
    wire = b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n"
    again = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

    async def go() -> None:
        async with Upstream([Answer([wire]), Answer([again])]) as up:
            pool = UpstreamPool(up.url, connect_timeout=TIMEOUT)
            got = await _exchange(pool, "HEAD")
            assert got.status == 200 and got.body == b""
            reply = await pool.fetch("GET", "/", timeout=TIMEOUT)
            assert reply.body == b"ok" and up.connections == 1
            pool.close()

    asyncio.run(go())


# -- broken answers ----------------------------------------------------------------------------
GOOD_HEAD = b"HTTP/1.1 200 OK\r\n"
BROKEN = {
    "not http": b"ICY 200 OK\r\n\r\n",
    "http/2 status line": b"HTTP/2 200 OK\r\nContent-Length: 0\r\n\r\n",
    "unknown minor version": b"HTTP/1.7 200 OK\r\nContent-Length: 0\r\n\r\n",
    "no status": b"HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
    "letters in status": b"HTTP/1.1 2x0 OK\r\nContent-Length: 0\r\n\r\n",
    "two-digit status": b"HTTP/1.1 20 OK\r\nContent-Length: 0\r\n\r\n",
    "underscore status": b"HTTP/1.1 2_00 OK\r\nContent-Length: 0\r\n\r\n",
    "switching protocols": b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n",
    "non-hex chunk size": GOOD_HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n",
    "negative chunk size": GOOD_HEAD + b"Transfer-Encoding: chunked\r\n\r\n-2\r\nab\r\n0\r\n\r\n",
    "0x chunk size": GOOD_HEAD + b"Transfer-Encoding: chunked\r\n\r\n0x2\r\nab\r\n0\r\n\r\n",
    "signed chunk size": GOOD_HEAD + b"Transfer-Encoding: chunked\r\n\r\n+2\r\nab\r\n0\r\n\r\n",
    "underscore chunk size": GOOD_HEAD + b"Transfer-Encoding: chunked\r\n\r\n1_0\r\n" + b"a" * 16,
    "empty chunk size": GOOD_HEAD + b"Transfer-Encoding: chunked\r\n\r\n\r\nab\r\n0\r\n\r\n",
    "chunk longer than its size": GOOD_HEAD
    + b"Transfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n",
    "endless chunk-size line": GOOD_HEAD
    + b"Transfer-Encoding: chunked\r\n\r\n"
    + b"0" * (MAX_LINE_BYTES + 10),
    "endless trailers": GOOD_HEAD
    + b"Transfer-Encoding: chunked\r\n\r\n0\r\n"
    + b"X-T: 1\r\n" * (MAX_HEAD_BYTES // 8 + 10),
    "letters in length": GOOD_HEAD + b"Content-Length: ab\r\n\r\n",
    "negative length": GOOD_HEAD + b"Content-Length: -1\r\n\r\nabc",
    "signed length": GOOD_HEAD + b"Content-Length: +3\r\n\r\nabc",
    "superscript length": "HTTP/1.1 200 OK\r\nContent-Length: ²\r\n\r\nab".encode("latin-1"),
    "conflicting lengths": GOOD_HEAD + b"Content-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
    "conflicting length list": GOOD_HEAD + b"Content-Length: 3, 4\r\n\r\nabcd",
    "endless head": GOOD_HEAD + b"X-Filler: " + b"x" * (MAX_HEAD_BYTES + 10),
    "oversized head in one piece": GOOD_HEAD
    + b"X-Filler: "
    + b"x" * (MAX_HEAD_BYTES + 10)
    + b"\r\nContent-Length: 0\r\n\r\n",
}
TRUNCATED = {
    "in the head": (b"HTTP/1.1 200 OK\r\nContent-Le", "close"),
    "in a length body": (GOOD_HEAD + b"Content-Length: 10\r\n\r\nabc", "close"),
    "in a chunk": (GOOD_HEAD + b"Transfer-Encoding: chunked\r\n\r\na\r\nabc", "close"),
    "before the last chunk": (
        GOOD_HEAD + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n",
        "close",
    ),
    "in the trailers": (GOOD_HEAD + b"Transfer-Encoding: chunked\r\n\r\n0\r\nX: 1\r\n", "close"),
    "reset in a length body": (GOOD_HEAD + b"Content-Length: 10\r\n\r\nabc", "reset"),
    "reset while read until close": (GOOD_HEAD + b"\r\nabc", "reset"),
}


@pytest.mark.parametrize("name", sorted(BROKEN) + sorted(TRUNCATED))
@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_a_broken_answer_is_a_protocol_error_never_a_hang_or_a_body(
    name: str, data: st.DataObject
) -> None:
    """Broken answers are ``UpstreamError``; a reset one is the reset (``OSError`` both)."""
    wire, then = TRUNCATED[name] if name in TRUNCATED else (BROKEN[name], "hold")
    body_at = wire.find(b"\r\n\r\n") + 4  # a piece of its own from here: the streaming path
    cuts = data.draw(st.just([body_at]) | st.lists(st.integers(0, len(wire)), max_size=12))

    async def go() -> None:
        async with Upstream([Answer(_cut(wire, cuts), then)]) as up:
            pool = UpstreamPool(up.url, connect_timeout=TIMEOUT)
            with pytest.raises(ConnectionResetError if then == "reset" else UpstreamError):
                await _exchange(pool)
            # the broken connection is closed (the upstream sees it) and never offered again
            await asyncio.wait_for(up.peer_closed.wait(), TIMEOUT)
            assert not pool._idle and all(not c.usable for c in pool._all)

    asyncio.run(go())


def test_an_answer_that_stops_coming_ends_at_the_fetch_timeout_and_closes_the_connection() -> None:
    wire = GOOD_HEAD + b"Content-Length: 10\r\n\r\nabc"

    async def go() -> None:
        async with Upstream([Answer([wire], "hold")]) as up:
            pool = UpstreamPool(up.url, connect_timeout=TIMEOUT)
            with pytest.raises(TimeoutError):
                await pool.fetch("GET", "/slow", timeout=0.3)
            await asyncio.wait_for(up.peer_closed.wait(), TIMEOUT)
            assert not pool._idle

    asyncio.run(go())


def test_fetch_refuses_an_answer_over_its_limit() -> None:
    wire = GOOD_HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + b"10\r\n" + b"a" * 16 + b"\r\n"
    wire = wire + wire[len(GOOD_HEAD) + 30 :] * 10 + b"0\r\n\r\n"

    async def go() -> None:
        async with Upstream([Answer([wire])]) as up:
            pool = UpstreamPool(up.url, connect_timeout=TIMEOUT)
            with pytest.raises(UpstreamError, match="larger than 40 bytes"):
                await pool.fetch("GET", "/big", timeout=TIMEOUT, limit=40)
            await asyncio.wait_for(up.peer_closed.wait(), TIMEOUT)
            assert not pool._idle

    asyncio.run(go())


def test_bytes_nobody_asked_for_close_the_connection() -> None:
    extra = GOOD_HEAD + b"Content-Length: 2\r\n\r\nokGARBAGE"

    async def go() -> None:
        async with Upstream(
            [Answer([b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"]), Answer([])]
        ) as up:
            pool = UpstreamPool(up.url, connect_timeout=TIMEOUT)
            assert (await pool.fetch("GET", "/", timeout=TIMEOUT)).status == 200
            (conn,) = pool._idle
            conn.data_received(b"unsolicited")  # as if the idle connection got it
            assert conn.transport is None or conn.transport.is_closing()
            # an answer with bytes after its end: decoded, then its connection not reused
        async with Upstream([Answer([extra])]) as up:
            pool = UpstreamPool(up.url, connect_timeout=TIMEOUT)
            assert (await pool.fetch("GET", "/", timeout=TIMEOUT)).body == b"ok"
            assert not pool._idle

    asyncio.run(go())


# -- pausing, closing, connecting --------------------------------------------------------------
def test_a_paused_connection_delivers_nothing_until_resumed() -> None:
    body = b"x" * 3_000_000
    wire = GOOD_HEAD + f"Content-Length: {len(body)}\r\n\r\n".encode() + body

    async def go() -> None:
        async with Upstream([Answer([wire])]) as up:
            pool = UpstreamPool(up.url, connect_timeout=TIMEOUT)
            conn = await pool.acquire()
            sink = Recorder()
            got_some = asyncio.Event()
            orig = sink.on_data

            def on_data(data: bytes) -> None:
                orig(data)
                got_some.set()

            sink.on_data = on_data  # type: ignore[method-assign]
            conn.send(pool.head("GET", "/", {}, 0), b"", sink)
            await asyncio.wait_for(got_some.wait(), TIMEOUT)
            conn.pause()
            held = len(sink.body)
            for _ in range(50):
                await asyncio.sleep(0)
            assert len(sink.body) == held < len(body)
            conn.resume()
            assert await asyncio.wait_for(sink.done, TIMEOUT) is None
            assert sink.body == body
            pool.close()

    asyncio.run(go())


def test_closing_the_pool_closes_its_connections_and_abandons_requests() -> None:
    async def go() -> None:
        async with Upstream([Answer([GOOD_HEAD], "hold")]) as up:
            pool = UpstreamPool(up.url, connect_timeout=TIMEOUT)
            conn = await pool.acquire()
            sink = Recorder()
            conn.send(pool.head("GET", "/", {}, 0), b"", sink)
            pool.close()
            await asyncio.wait_for(up.peer_closed.wait(), TIMEOUT)
            assert not sink.done.done()  # abandoned: no callback after close
            assert not conn.usable
            conn.pause()  # harmless once closed
            conn.resume()

    asyncio.run(go())


def test_a_refused_connection_is_an_oserror() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def go() -> None:
        pool = UpstreamPool(f"http://127.0.0.1:{port}", connect_timeout=TIMEOUT)
        with pytest.raises(OSError):
            await pool.fetch("GET", "/health", timeout=TIMEOUT)

    asyncio.run(go())


def test_replica_urls_are_checked_and_parsed() -> None:
    for bad in ("ftp://h/", "http://", "h:80", "unix:/x"):
        with pytest.raises(ValueError):
            UpstreamPool(bad, 1.0)
    p = UpstreamPool("https://gpu-1.example:8443/v1root/", 1.0, tls=False)
    assert (p.host, p.port, p.host_header, p.path_prefix) == (
        "gpu-1.example",
        8443,
        "gpu-1.example:8443",
        "/v1root",
    )
    assert UpstreamPool("https://h", 1.0).port == 443 and UpstreamPool("http://h", 1.0).port == 80
    assert request_head("GET", "h:1", "/p", {"A": "b"}, 0) == (
        b"GET /p HTTP/1.1\r\nHost: h:1\r\nContent-Length: 0\r\nA: b\r\n\r\n"
    )


def test_tls_answers_decode_and_verification_is_enforced(tmp_path) -> None:
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server_ctx)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    assert tls_context(False).verify_mode == ssl.CERT_NONE
    assert tls_context(True).verify_mode == ssl.CERT_REQUIRED
    wire = GOOD_HEAD + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"

    async def go() -> None:
        up = Upstream([Answer(_cut(wire, [3, 20, 40, 45]), "keep")] * 3)
        up.server = await asyncio.start_server(up._serve, "127.0.0.1", 0, ssl=server_ctx)
        url = up.url.replace("http://", "https://")
        try:
            for tls in (str(ca_file), False):
                pool = UpstreamPool(url, connect_timeout=TIMEOUT, tls=tls)
                assert (await pool.fetch("GET", "/", timeout=TIMEOUT)).body == b"hello"
                pool.close()
            pool = UpstreamPool(url, connect_timeout=TIMEOUT, tls=True)  # the system's CAs
            with pytest.raises(ssl.SSLError):
                await pool.fetch("GET", "/", timeout=TIMEOUT)
        finally:
            await up.__aexit__()

    asyncio.run(go())


def test_a_connection_is_handed_out_once_at_a_time() -> None:
    async def go() -> None:
        ok = GOOD_HEAD + b"Content-Length: 1\r\n\r\na"
        async with Upstream([Answer([ok]), Answer([ok]), Answer([ok])]) as up:
            pool = UpstreamPool(up.url, connect_timeout=TIMEOUT)
            a, b = await pool.acquire(), await pool.acquire()
            assert a is not b and isinstance(a, UpstreamConnection)
            for c in (a, b):
                s = Recorder()
                c.send(pool.head("GET", "/", {}, 0), b"", s)
                assert await asyncio.wait_for(s.done, TIMEOUT) is None
            assert len(pool._idle) == 2
            pool._idle[0].close()  # a closed idle connection is skipped
            c = await pool.acquire()
            assert c.usable
            pool.close()

    asyncio.run(go())


# -- keep-alive ----------------------------------------------------------------------------------
OK = GOOD_HEAD + b"Content-Length: 2\r\n\r\nok"


def test_a_reused_connection_closed_unanswered_is_sent_once_more_on_a_new_one() -> None:
    """The server closed the idle connection as the request went out: nothing was read, so
    the request goes again, once, on a new connection; a new connection closed unanswered is
    the replica's failure."""

    async def go() -> None:
        async with Upstream([Answer([OK]), Answer([], "close"), Answer([OK])]) as up:
            pool = UpstreamPool(up.url, connect_timeout=TIMEOUT)
            assert (await pool.fetch("GET", "/a", timeout=TIMEOUT)).body == b"ok"
            assert (await pool.fetch("GET", "/b", timeout=TIMEOUT)).body == b"ok"
            assert pool.stale_retries == 1 and up.connections == 2
            pool.close()
        async with Upstream([Answer([], "close")]) as up:
            pool = UpstreamPool(up.url, connect_timeout=TIMEOUT)
            with pytest.raises(UpstreamError, match="closed the connection"):
                await pool.fetch("GET", "/", timeout=TIMEOUT)
            assert pool.stale_retries == 0

    asyncio.run(go())


def test_an_idle_connection_is_not_reused_past_its_keep_alive() -> None:
    async def go() -> None:
        async with Upstream([Answer([OK]), Answer([OK])]) as up:
            pool = UpstreamPool(up.url, connect_timeout=TIMEOUT, keepalive=0.0)
            for _ in range(2):
                assert (await pool.fetch("GET", "/", timeout=TIMEOUT)).body == b"ok"
            assert up.connections == 2  # the first, expired at once, was closed, not reused
            pool.close()

    asyncio.run(go())


def test_keep_alive_timeout_header() -> None:
    assert keepalive_timeout("timeout=5, max=100") == 5.0
    assert keepalive_timeout("max=100, Timeout = 2.5") == 2.5
    assert keepalive_timeout("timeout=soon") is None
    assert keepalive_timeout("timeout=-1") is None
    assert keepalive_timeout("max=3") is None


def test_a_cancelled_fetch_closes_its_connection() -> None:
    async def go() -> None:
        async with Upstream([Answer([GOOD_HEAD], "hold")]) as up:
            pool = UpstreamPool(up.url, connect_timeout=TIMEOUT)
            task = asyncio.create_task(pool.fetch("GET", "/", timeout=TIMEOUT))
            await asyncio.wait_for(up.got_request.wait(), TIMEOUT)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.wait_for(up.peer_closed.wait(), TIMEOUT)
            assert not pool._idle

    asyncio.run(go())
