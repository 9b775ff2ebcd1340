"""The gateway against hostile or unlucky connections, with real processes: clients that never
read their stream, many streams from one client. A client's doing is never held against a
replica, and one client cannot hold the gateway's slots for long."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import time

import pytest

from scripted_upstream import ScriptedUpstream, replica_script
from test_gateway_support import (
    MODEL,
    fleet,
    gateway,
    http,
    metric,
    metrics,
    procs,
    sim_server,
    states,
    wait_for,
    wait_ready,
)


@pytest.fixture(scope="module")
def pair():
    reps = [sim_server(), sim_server()]
    try:
        yield reps
    finally:
        for r in reps:
            r.stop()


SLOW_READERS_S = float(os.environ.get("SERVEFLEET_TEST_SLOW_READERS_S", "4"))
"""How long the non-reading clients hold their streams (60 for the full-length check)."""


def non_reader(url: str, body: dict, headers: dict | None = None) -> socket.socket:
    """A client that sends a streamed request and never reads its answer (a tiny receive
    buffer, so that the gateway's writes to it soon block)."""
    host, port = url.split("//")[1].split(":")
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect((host, int(port)))
    raw = json.dumps({**body, "stream": True}).encode()
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    s.sendall(
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(raw)}\r\n{extra}\r\n".encode()
        + raw
    )
    return s


def test_clients_that_never_read_eject_no_replica_and_lose_only_their_own_streams():
    """Their streams pause the upstream reads (backpressure): the watchdog must not take that
    for a hung replica, and a write stuck for write_timeout ends that stream (its slot freed)."""
    write_timeout = SLOW_READERS_S / 2
    reps = [sim_server(time_scale=50.0), sim_server(time_scale=50.0)]
    with procs(*reps):
        gw = gateway(
            "--policy", "round-robin",
            "--set", "stream.min_stall=1.0", "--set", "stream.stall_factor=2",
            "--set", f"stream.write_timeout={write_timeout}",
            "--set", "admission.max_concurrency=4", replicas=reps,
        )  # fmt: skip
        with procs(gw):
            wait_ready(gw, 2)
            # 256 sequences of 3,500 tokens: about 7 MB, twice what the sockets' buffers hold
            hog = {"model": MODEL, "prompt": [f"a long story {i}" for i in range(16)],
                   "max_tokens": 3500, "ignore_eos": True, "n": 16}  # fmt: skip
            socks = [non_reader(gw.url, hog) for _ in range(3)]
            try:
                wait_for(lambda: fleet(gw)["admission"]["active"] == 3, 10, "3 streams admitted")
                t_end = time.monotonic() + SLOW_READERS_S
                answered = 0
                while time.monotonic() < t_end:
                    assert set(states(gw).values()) == {"ready"}, [
                        r["recent_errors"] for r in fleet(gw)["replicas"]
                    ]
                    body = {"model": MODEL, "prompt": f"hello {answered}", "max_tokens": 8,
                            "ignore_eos": True, "stream": answered % 2 == 1}  # fmt: skip
                    status, _, out = http("POST", gw.url + "/v1/completions", body, timeout=10)
                    assert status == 200, out
                    if body["stream"]:
                        assert out.rstrip().endswith("data: [DONE]"), out
                    else:
                        assert len(out["choices"][0]["text"].split()) == 8
                    answered += 1
                assert answered >= 5
                # each stuck stream ended after write_timeout: the slots are free again
                wait_for(lambda: fleet(gw)["admission"]["active"] == 0, 10, "slots freed")
                m = metrics(gw)
                assert metric(m, "servefleet_gateway_slow_client_streams_total") == 3
                assert metric(m, "servefleet_gateway_ejections_total") == 0
                assert metric(m, "servefleet_gateway_blamed_failures_total") == 0
                assert set(states(gw).values()) == {"ready"}
            finally:
                for s in socks:
                    s.close()
            assert "Traceback" not in gw.stderr()


def test_streams_per_client_are_capped():
    rep = sim_server(time_scale=1.0)
    with procs(rep):
        gw = gateway("--set", "admission.max_streams_per_client=2", replicas=[rep])
        with procs(gw):
            wait_ready(gw, 1)
            body = {"model": MODEL, "prompt": "long", "max_tokens": 2000, "ignore_eos": True}
            socks = [non_reader(gw.url, body) for _ in range(2)]
            try:
                wait_for(lambda: fleet(gw)["admission"]["active"] == 2, 10, "2 streams open")
                status, h, out = http("POST", gw.url + "/v1/completions", {**body, "stream": True})
                assert status == 429 and out["error"]["code"] == "too_many_streams", out
                assert h["Retry-After"] == "1"
                # a request that is not a stream is not capped
                status, _, _ = http("POST", gw.url + "/v1/completions", {**body, "max_tokens": 2})
                assert status == 200
            finally:
                for s in socks:
                    s.close()
            wait_for(lambda: fleet(gw)["admission"]["active"] == 0, 10, "the streams ended")
            status, _, _ = http(
                "POST", gw.url + "/v1/completions", {**body, "max_tokens": 2, "stream": True}
            )
            assert status == 200


def test_a_reused_connection_closed_before_answering_is_retried_once_and_blamed_on_no_one():
    """The keep-alive race: the replica closes a connection as it goes idle just when the
    gateway sends on it. Here every request but a connection's first finds it so."""
    with ScriptedUpstream(replica_script(MODEL, close_reused=True)) as up:
        gw = gateway("--replica", up.url)
        with procs(gw):
            wait_for(lambda: list(states(gw).values()) == ["ready"], 20, "the replica ready")
            for i in range(6):
                body = {"model": MODEL, "prompt": f"p {i}", "max_tokens": 3, "stream": i % 2 == 1}
                status, _, out = http("POST", gw.url + "/v1/completions", body)
                assert status == 200, out
                if body["stream"]:
                    assert out.rstrip().endswith("data: [DONE]") and '" c"' in out, out
                else:
                    assert out["choices"][0]["text"] == " a b c"
            rep = fleet(gw)["replicas"][0]
            assert rep["state"] == "ready" and rep["stale_retries"] >= 6, rep
            assert rep["recent_errors"] == [], rep
            m = metrics(gw)
            assert metric(m, "servefleet_gateway_attempt_failures_total") == 0
            assert metric(m, "servefleet_gateway_blamed_failures_total") == 0
            assert metric(m, "servefleet_gateway_requests_total", status="200") == 6
            # each request was sent twice at most: once on a reused connection, once on a new
            gen = [s for s in up.seen if s.path == "/v1/completions"]
            assert len(gen) <= 12 and sum(s.nth == 0 for s in gen) == 6


def test_the_sim_server_closes_idle_keep_alive_connections_as_vllm_does():
    os.environ["VLLM_HTTP_TIMEOUT_KEEP_ALIVE"] = "0.5"
    try:
        rep = sim_server()
    finally:
        del os.environ["VLLM_HTTP_TIMEOUT_KEEP_ALIVE"]
    with procs(rep):
        s = socket.create_connection(("127.0.0.1", rep.port))
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        t0 = time.monotonic()
        got = b""
        s.settimeout(10)
        while chunk := s.recv(65536):  # the answer, then the server's close (EOF)
            got += chunk
        idle = time.monotonic() - t0
        s.close()
        assert got.startswith(b"HTTP/1.1 200")
        assert 0.4 < idle < 3.0, idle


def test_the_upstream_pool_expires_idle_connections_before_the_server_would():
    from scripted_upstream import json_answer
    from servefleet.gateway.upstream import UpstreamPool, keepalive_timeout

    assert keepalive_timeout("timeout=5, max=100") == 5.0
    assert keepalive_timeout("max=100") is None and keepalive_timeout("timeout=x") is None

    def script(s):
        extra = "Keep-Alive: timeout=1\r\n" if s.path == "/says" else ""
        return [json_answer({}, extra=extra)]

    async def go(up):
        pool = UpstreamPool(up.url, 2.0, keepalive=0.3)
        await pool.fetch("GET", "/a")
        await pool.fetch("GET", "/a")
        assert up.connections == 1  # reused while fresh
        loop = asyncio.get_running_loop()
        (conn,) = pool._idle
        assert conn.idle_until - loop.time() <= 0.3
        conn.idle_until = loop.time()  # as if 0.3 s had passed
        await pool.fetch("GET", "/says")
        assert up.connections == 2  # expired: a new connection
        (conn,) = pool._idle  # the server's timeout=1 keeps it 0.5 s at most (margin)
        assert conn.idle_until - loop.time() <= 0.3
        pool.keepalive = 10.0
        await pool.fetch("GET", "/says")
        (conn,) = pool._idle
        assert 0.4 < conn.idle_until - loop.time() <= 0.5
        pool.close()

    with ScriptedUpstream(script) as up:
        asyncio.run(go(up))


def raw_exchange(port: int, data: bytes) -> bytes:
    """Send ``data`` on a new connection; everything the gateway answers until it closes."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.settimeout(10)
        with contextlib.suppress(ConnectionError):
            s.sendall(data)
        got = b""
        with contextlib.suppress(ConnectionError):
            while chunk := s.recv(65536):
                got += chunk
        return got


def answer_of(raw: bytes) -> tuple[int, dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)


def test_request_heads_over_the_limits_get_431_and_their_connection_closed(pair):
    gw = gateway("--set", "server.max_head_bytes=4096", "--set", "server.max_header_count=10",
                 replicas=pair)  # fmt: skip
    with procs(gw):
        wait_ready(gw, 2)
        start = b"GET /health HTTP/1.1\r\nHost: x\r\n"
        many = start + b"".join(b"X-H%d: v\r\n" % i for i in range(20)) + b"\r\n"
        big = start + b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 1000) for i in range(8)) + b"\r\n"
        line = start + b"X-Long: " + b"v" * 10_000 + b"\r\n\r\n"
        # a head that never ends: refused once it passes the limit, not read on
        endless = start + b"".join(b"X-H: %s\r\n" % (b"v" * 1000) for _ in range(200))
        for i, what in enumerate((many, big, line, endless)):
            status, body = answer_of(raw_exchange(gw.port, what))
            assert status == 431 and body["error"]["code"] == "head_too_large", (i, body)
        ok = raw_exchange(gw.port, start + b"Connection: close\r\n\r\n")
        assert ok.startswith(b"HTTP/1.1 200")
        assert "Traceback" not in gw.stderr()


def test_connections_per_address_are_capped(pair):
    gw = gateway("--set", "server.max_connections_per_address=3", replicas=pair)
    with procs(gw):
        wait_ready(gw, 2)
        held = [socket.create_connection(("127.0.0.1", gw.port)) for _ in range(3)]
        try:
            status, body = answer_of(raw_exchange(gw.port, b""))
            assert status == 429 and body["error"]["code"] == "too_many_connections", body
        finally:
            for s in held:
                s.close()
        wait_for(lambda: http("GET", gw.url + "/health")[0] == 200, 10, "a connection again")


def test_bodies_held_at_once_are_bounded(pair):
    gw = gateway("--set", f"server.max_buffered_bytes={1 << 20}", replicas=pair)
    with procs(gw):
        wait_ready(gw, 2)
        slow = socket.create_connection(("127.0.0.1", gw.port))
        try:
            slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                         b"application/json\r\nContent-Length: 900000\r\n\r\n" + b" " * 700_000)  # fmt: skip
            wait_for(lambda: fleet(gw)["admission"]["body_bytes_held"] >= 700_000, 10, "held")
            big = {"model": MODEL, "prompt": "a " * 200_000, "max_tokens": 1}
            status, h, body = http("POST", gw.url + "/v1/completions", big)
            assert status == 503 and body["error"]["code"] == "gateway_busy", body
            assert h["Retry-After"] == "1"
        finally:
            slow.close()
        wait_for(lambda: fleet(gw)["admission"]["body_bytes_held"] == 0, 10, "given back")
        status, _, body = http("POST", gw.url + "/v1/completions", big)
        assert status == 400 and body["error"]["code"] == "context_length_exceeded", body


def test_n_is_capped(pair):
    gw = gateway("--set", "admission.max_n=4", replicas=pair)
    with procs(gw):
        wait_ready(gw, 2)
        body = {"model": MODEL, "prompt": "hi", "max_tokens": 2, "n": 5}
        status, _, out = http("POST", gw.url + "/v1/completions", body)
        assert status == 400 and out["error"]["param"] == "n", out
        status, _, out = http("POST", gw.url + "/v1/completions", {**body, "n": 4})
        assert status == 200 and len(out["choices"]) == 4


def test_an_upstream_event_that_never_ends_is_bounded():
    """The replica's event passes stream.max_event_bytes without its blank line: the attempt
    fails, as do its retries, and the client gets a 502 that says so."""
    endless = b"data: " + b"x" * 300_000

    def script(s):
        if s.path == "/v1/completions":
            head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            return [head, b"%x\r\n%s\r\n" % (len(endless), endless)]
        return replica_script(MODEL)(s)

    with ScriptedUpstream(script) as up:
        gw = gateway("--replica", up.url, "--set", "stream.max_event_bytes=65536")
        with procs(gw):
            wait_for(lambda: list(states(gw).values()) == ["ready"], 20, "the replica ready")
            body = {"model": MODEL, "prompt": "hi", "max_tokens": 2, "stream": True}
            status, _, out = http("POST", gw.url + "/v1/completions", body)
            if status == 200:  # the stream's head was out: an error event, then [DONE]
                assert out.rstrip().endswith("data: [DONE]") and "xxxx" not in out, out
                assert "upstream_failed_mid_stream" in out and "event_too_large" in out
            else:
                assert status == 502 and "event_too_large" in out["error"]["message"], out
            errors = fleet(gw)["replicas"][0]["recent_errors"]
            assert any(e["kind"] == "event_too_large" for e in errors), errors
