"""The gateway against hostile or unlucky connections, with real processes: clients that never
read their stream, many streams from one client. A client's doing is never held against a
replica, and one client cannot hold the gateway's slots for long."""

from __future__ import annotations

import json
import os
import socket
import time

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
    write_timeout = min(2.0, SLOW_READERS_S / 2)
    reps = [sim_server(time_scale=50.0), sim_server(time_scale=50.0)]
    with procs(*reps):
        gw = gateway(
            "--policy", "round-robin",
            "--set", "stream.min_stall=0.2", "--set", "stream.stall_factor=2",
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
                    assert set(states(gw).values()) == {"ready"}, fleet(gw)["replicas"]
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
