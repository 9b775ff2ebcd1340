"""The gateway against a hostile client, with real processes: bodies it and a replica could
read differently, requests that fail on every replica, forged identities, Redis killed and
hung, slow and huge uploads, a replica frozen (SIGSTOP) mid-stream, clients that leave, and
malformed HTTP. Nothing here may switch the fleet off or get a 5xx or a non-JSON error."""

from __future__ import annotations

import asyncio
import gzip
import json
import signal
import socket
import time

import aiohttp
import pytest
import yaml

from test_gateway_failover import stream
from test_gateway_support import (
    MODEL,
    Redis,
    fleet,
    free_port,
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

ADMIN = {"Authorization": "Bearer sim-admin"}


def raw_post(url: str, path: str, body: bytes, headers: dict | None = None):
    """POST a body given as bytes (e.g. with JSON escapes of lone surrogates)."""
    return http("POST", url + path, body, headers)


def openai_error(status: int, headers: dict, body) -> dict:
    """The error object of an OpenAI-shaped JSON error answer (asserts the shape)."""
    assert headers.get("Content-Type", "").startswith("application/json"), (status, headers, body)
    assert isinstance(body, dict) and set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"], err
    return err


@pytest.fixture(scope="module")
def pair():
    reps = [sim_server(), sim_server()]
    try:
        yield reps
    finally:
        for r in reps:
            r.stop()


# -- blame the right party -----------------------------------------------------------------
def test_bad_bodies_switch_no_replica_off(pair):
    """Bodies a gateway could read differently from a replica.
    Six `"stream": "no"` (vLLM reads false: a JSON answer, as from vLLM) and six lone
    surrogates (vLLM's 400, the tokenizer's words), then ten normal requests: all served,
    nothing ejected, nothing blamed."""
    gw = gateway("--set", "breaker.consecutive_failures=2", replicas=pair)
    with procs(gw):
        wait_ready(gw, 2)
        for i in range(6):
            status, h, body = http("POST", gw.url + "/v1/completions",
                                   {"model": MODEL, "prompt": f"p{i}", "max_tokens": 3, "stream": "no"})  # fmt: skip
            assert status == 200 and h["Content-Type"].startswith("application/json"), body
            assert body["object"] == "text_completion"
        bad = [
            ("/v1/completions", b'{"model": "%s", "prompt": "a\\ud800b", "stream": true}'),
            ("/v1/chat/completions",
             b'{"model": "%s", "messages": [{"role": "user", "content": "x\\udfffy"}], "stream": true}'),
        ]  # fmt: skip
        for i in range(6):
            path, raw = bad[i % 2]
            raw = raw.replace(b"%s", MODEL.encode())
            status, h, body = raw_post(gw.url, path, raw)
            err = openai_error(status, h, body)
            # exactly what a replica (as vLLM) answers
            direct = raw_post(pair[0].url, path, raw)
            assert status == direct[0] == 400 and err == direct[2]["error"], (err, direct)
            assert "surrogates not allowed" in err["message"]
        status, h, body = http("POST", gw.url + "/v1/chat/completions",
                               {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text"}]}]})  # fmt: skip
        assert status == 400 and openai_error(status, h, body)["param"] == "messages.content.0"
        for i in range(10):
            status, _, body = http("POST", gw.url + "/v1/completions",
                                   {"model": MODEL, "prompt": f"fine {i}", "max_tokens": 2})  # fmt: skip
            assert status == 200, body
        assert set(states(gw).values()) == {"ready"}
        m = metrics(gw)
        assert metric(m, "servefleet_gateway_ejections_total") == 0
        assert metric(m, "servefleet_gateway_blamed_failures_total") == 0
        for r in fleet(gw)["replicas"]:  # the load bookkeeping is back to zero
            assert (r["in_flight"], r["streaming"], r["pending_prefills"]) == (0, 0, 0), r


def test_a_request_that_fails_on_every_replica_is_answered_not_spread(pair):
    """A "query of death" (both replicas answer it 500): after two alike failures the client
    gets the replica's answer; no third replica, no breaker opens, other traffic flows."""
    third = sim_server()
    for r in (*pair, third):
        http("POST", r.url + "/admin/faults", {"fail_matching": "POISON"}, ADMIN)
    try:
        gw = gateway("--set", "breaker.consecutive_failures=2", "--set", "retry.max_attempts=3",
                     replicas=[*pair, third])  # fmt: skip
        with procs(gw):
            wait_ready(gw, 3)
            for i in range(4):
                status, h, body = http("POST", gw.url + "/v1/completions",
                                       {"model": MODEL, "prompt": f"POISON {i}", "max_tokens": 2})  # fmt: skip
                assert (
                    status == 500 and "Injected fault" in openai_error(status, h, body)["message"]
                )
                ok = http(
                    "POST",
                    gw.url + "/v1/completions",
                    {"model": MODEL, "prompt": "ok", "max_tokens": 2},
                )
                assert ok[0] == 200
            m = metrics(gw)
            assert metric(m, "servefleet_gateway_poisoned_requests_total") == 4
            assert metric(m, "servefleet_gateway_attempt_failures_total") == 8  # 2 each, never 3
            assert metric(m, "servefleet_gateway_blamed_failures_total") == 0
            assert set(states(gw).values()) == {"ready"}
    finally:
        for r in (*pair, third):
            http("POST", r.url + "/admin/faults", {"reset": True}, ADMIN)
        third.stop()


# -- identity you can trust ----------------------------------------------------------------
def test_a_forged_user_header_cannot_exceed_its_keys_limit(pair, tmp_path):
    from servefleet.gateway.identity import key_hash

    keys = tmp_path / "keys.yaml"
    keys.write_text(yaml.safe_dump({"keys": [
        {"name": "alice", "sha256": key_hash("sk-alice")},
        {"name": "gold", "sha256": key_hash("sk-gold"), "tier": "gold"},
    ]}))  # fmt: skip
    gw = gateway(
        "--set", f"auth.keys_file={keys}", "--set", "rate_limit.requests_per_second=0.01",
        "--set", "rate_limit.request_burst=3", "--set", "rate_limit.tiers.gold.requests_per_second=0.01",
        "--set", "rate_limit.tiers.gold.request_burst=6", replicas=pair,
    )  # fmt: skip
    with procs(gw):
        wait_ready(gw, 2)

        def go(headers: dict, user: str | None = None) -> int:
            body = {"model": MODEL, "prompt": "x", "max_tokens": 1}
            if user:
                body["user"] = user
            return http("POST", gw.url + "/v1/completions", body, headers)[0]

        alice = [
            go({"Authorization": "Bearer sk-alice", "X-User-ID": f"u{i}"}, f"b{i}")
            for i in range(8)
        ]
        assert alice.count(200) == 3 and alice.count(429) == 5
        assert [go({"Authorization": "Bearer sk-gold"}) for _ in range(8)].count(200) == 6
        # no key (or an invented one): the client's address is the bucket, whatever it says
        anon = [
            go({"Authorization": f"Bearer made-up-{i}", "X-User-ID": f"v{i}"}) for i in range(6)
        ]
        assert anon.count(200) == 3
    # keys required: no key, no service
    strict = gateway(
        "--set", f"auth.keys_file={keys}", "--set", "auth.required=true", replicas=pair
    )
    with procs(strict):
        wait_ready(strict, 2)
        status, h, body = http(
            "POST", strict.url + "/v1/completions", {"model": MODEL, "prompt": "x"}
        )
        assert status == 401 and openai_error(status, h, body)["code"] == "invalid_api_key"
        ok = http("POST", strict.url + "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 1},
                  {"Authorization": "Bearer sk-alice"})  # fmt: skip
        assert ok[0] == 200
    # a trusted upstream may name the user
    proxied = gateway("--set", "auth.user_header=X-User-ID", "--set", "auth.trusted_proxies=[127.0.0.1]",
                      "--set", "rate_limit.requests_per_second=0.01", "--set", "rate_limit.request_burst=2",
                      replicas=pair)  # fmt: skip
    with procs(proxied):
        wait_ready(proxied, 2)
        per_user = [http("POST", proxied.url + "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 1},
                         {"X-User-ID": f"user-{i // 2}"})[0] for i in range(6)]  # fmt: skip
        assert per_user == [200] * 6  # two each, within each user's burst


# -- Redis outage --------------------------------------------------------------------------
def test_redis_down_hung_or_late_never_costs_a_5xx(pair):
    port = free_port()
    gw = gateway(
        "--set", f"rate_limit.redis_url=redis://127.0.0.1:{port}/0", "--set", "rate_limit.requests_per_second=100",
        "--set", "rate_limit.redis_timeout=0.2", replicas=pair,
    )  # fmt: skip
    body = {"model": MODEL, "prompt": "x", "max_tokens": 1}

    def ready() -> tuple[int, dict]:
        status, _, b = http("GET", gw.url + "/ready")
        return status, b["rate_limit"]

    with procs(gw):  # started with no Redis at all
        wait_ready(gw, 2)
        assert http("POST", gw.url + "/v1/completions", body)[0] == 200
        status, rl = ready()
        assert status == 200 and rl["backend"] == "local" and "degraded" in rl
        assert metric(metrics(gw), "servefleet_gateway_ratelimit_degraded") == 1
        redis = Redis(port)  # Redis appears: the gateway uses it
        try:

            def on_redis() -> bool:
                http("POST", gw.url + "/v1/completions", body)
                return "degraded" not in ready()[1]

            wait_for(on_redis, 10, "the gateway to use Redis", every=0.2)
            redis.p.kill()  # killed
            redis.p.wait(5)
            statuses = [http("POST", gw.url + "/v1/completions", body)[0] for _ in range(5)]
            assert statuses == [200] * 5
            status, rl = ready()
            assert status == 200 and "degraded" in rl
        finally:
            redis.stop()
        hung = Redis(port)
        try:
            wait_for(on_redis, 10, "Redis back", every=0.2)
            hung.p.send_signal(signal.SIGSTOP)  # hung: accepts, never answers
            statuses = [
                http("POST", gw.url + "/v1/completions", body, timeout=10)[0] for _ in range(5)
            ]
            assert statuses == [200] * 5
            assert "degraded" in ready()[1]
            assert metric(metrics(gw), "servefleet_gateway_ratelimit_fallbacks_total") >= 5
        finally:
            hung.stop()


# -- hangs -----------------------------------------------------------------------------------
def test_a_sigstopped_replica_s_streams_resume_elsewhere(tmp_path):
    reps = [sim_server(time_scale=1.0), sim_server(time_scale=1.0)]
    with procs(*reps):
        gw = gateway("--policy", "round-robin", "--set", "health.interval=1.0",
                     "--set", "stream.min_stall=0.5", replicas=reps)  # fmt: skip
        with procs(gw):
            wait_ready(gw, 2)
            frozen = {}

            async def go():
                progress = [{} for _ in range(4)]

                async def freeze():
                    while not all(p.get("events", 0) >= 3 for p in progress):
                        await asyncio.sleep(0.01)
                    victim = next(r for r in reps if r.url.endswith(progress[0]["replica"]))
                    mine = [p for p in progress if victim.url.endswith(p["replica"])]
                    victim.signal(signal.SIGSTOP)
                    frozen["proc"] = victim
                    # the longest silence any of its streams then sees: how long until they
                    # resumed elsewhere (polled every 5 ms)
                    last = [(p["events"], time.monotonic()) for p in mine]
                    gap = 0.0
                    while not all(p["done"] for p in mine):
                        await asyncio.sleep(0.005)
                        now = time.monotonic()
                        for i, p in enumerate(mine):
                            if p["events"] != last[i][0]:
                                gap = max(gap, now - last[i][1])
                                last[i] = (p["events"], now)
                    frozen["resumed_after"] = gap

                body = {
                    "model": MODEL,
                    "prompt": "a long story",
                    "max_tokens": 150,
                    "ignore_eos": True,
                }
                tasks = [stream(gw.url, "/v1/completions", body, out=p) for p in progress]
                return await asyncio.wait_for(asyncio.gather(*tasks, freeze()), 60)

            try:
                results = asyncio.run(go())[:4]
                for r in results:
                    assert r["done"] and r["error"] is None and len(r["text"].split()) == 150, r
                # every stream moved on, the frozen replica's within 2 x the health interval
                print(
                    f"streams resumed {frozen['resumed_after']:.2f} s after SIGSTOP (health interval 1 s)"
                )
                assert states(gw)[frozen["proc"].url] in ("ejected", "unhealthy")
                m = metrics(gw)
                assert metric(m, "servefleet_gateway_ejections_total", source="stall") == 1
                assert metric(m, "servefleet_gateway_resumptions_total", outcome="resumed") >= 2
            finally:
                if "proc" in frozen:
                    frozen["proc"].signal(signal.SIGCONT)


def test_clients_that_leave_cancel_their_upstream_requests(pair):
    slow = sim_server(time_scale=1.0)
    with procs(slow):
        gw = gateway(replicas=[slow])
        with procs(gw):
            wait_ready(gw, 1)

            async def go():
                async with aiohttp.ClientSession() as s:
                    body = {
                        "model": MODEL,
                        "prompt": "long",
                        "max_tokens": 3000,
                        "ignore_eos": True,
                    }
                    tasks = [
                        asyncio.create_task(s.post(gw.url + "/v1/completions", json=body))
                        for _ in range(3)
                    ]
                    tasks.append(
                        asyncio.create_task(
                            s.post(gw.url + "/v1/completions", json={**body, "stream": True})
                        )
                    )

                    def running() -> float:
                        return metric(
                            http("GET", slow.url + "/metrics")[2], "vllm:num_requests_running"
                        )

                    while running() < 4:
                        await asyncio.sleep(0.02)
                    for t in tasks:
                        t.cancel()
                    await asyncio.gather(*tasks, return_exceptions=True)

            asyncio.run(go())
            wait_for(lambda: metric(http("GET", slow.url + "/metrics")[2], "vllm:num_requests_running") == 0,
                     5, "the replica to abort all four")  # fmt: skip
            wait_for(
                lambda: metric(metrics(gw), "servefleet_gateway_client_disconnects_total") == 4,
                5,
                "4 disconnects",
            )
            assert "Traceback" not in gw.stderr()


# -- resource limits -------------------------------------------------------------------------
def test_slow_headers_are_cut_off_and_huge_bodies_refused(pair):
    gw = gateway(
        "--set", "server.header_timeout=1.0", "--set", "server.body_timeout=1.0", replicas=pair
    )
    with procs(gw):
        wait_ready(gw, 2)

        async def slowloris(n: int) -> list[float]:
            async def one() -> float:
                r, w = await asyncio.open_connection("127.0.0.1", gw.port)
                w.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
                t0 = time.monotonic()
                try:
                    while True:  # a header byte every 0.2 s, forever
                        w.write(b"X")
                        await w.drain()
                        got = await asyncio.wait_for(r.read(1), 0.2) if not r.at_eof() else b""
                        if got == b"" and r.at_eof():
                            return time.monotonic() - t0
                except TimeoutError:
                    return await one_more(r, w, t0)
                except ConnectionError:
                    return time.monotonic() - t0
                finally:
                    w.close()

            async def one_more(r, w, t0) -> float:
                while time.monotonic() - t0 < 15:
                    try:
                        w.write(b"X")
                        await w.drain()
                        if await asyncio.wait_for(r.read(1), 0.2) == b"":
                            break
                    except TimeoutError:
                        continue
                    except ConnectionError:
                        break
                return time.monotonic() - t0

            return await asyncio.gather(*(one() for _ in range(n)))

        closed_after = asyncio.run(slowloris(300))
        assert max(closed_after) < 15  # every one was closed by the gateway
        print(
            f"300 slow-header connections closed after {min(closed_after):.2f}-{max(closed_after):.2f} s"
        )
        # a body that trickles: 408 within the body timeout
        with socket.create_connection(("127.0.0.1", gw.port)) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 100\r\n\r\n{\"mo")  # fmt: skip
            s.settimeout(10)
            head = s.recv(4096)
        assert head.startswith(b"HTTP/1.1 408") and b"application/json" in head
        # 8 MB prompts: refused from their Content-Length (the fleet's max_model_len is 4096)
        big = json.dumps({"model": MODEL, "prompt": "word " * (8 << 18)}).encode()
        before = sum(
            metric(http("GET", r.url + "/metrics")[2], "vllm:prompt_tokens_total") for r in pair
        )

        async def many_big_and_a_tiny():
            async with aiohttp.ClientSession() as s:

                async def post(data, **kw):
                    async with s.post(
                        gw.url + "/v1/completions",
                        data=data,
                        headers={"Content-Type": "application/json"},
                        **kw,
                    ) as r:
                        return r.status, await r.json()

                async def chunked():  # no Content-Length: cut off at the limit
                    async def gen():
                        for i in range(0, len(big), 1 << 16):
                            yield big[i : i + (1 << 16)]

                    return await post(gen())

                bigs = [asyncio.create_task(post(big)) for _ in range(16)] + [
                    asyncio.create_task(chunked())
                ]
                await asyncio.sleep(0)  # the big uploads are under way
                # (how long it waits: benchmarks/gateway_big_bodies.py, from another process)
                tiny = await post(json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 1}))
                return tiny, await asyncio.gather(*bigs)

        tiny, bigs = asyncio.run(many_big_and_a_tiny())
        assert tiny[0] == 200
        for status, body in bigs:
            assert status == 413 and body["error"]["code"] == "body_too_large", body
        after = sum(
            metric(http("GET", r.url + "/metrics")[2], "vllm:prompt_tokens_total") for r in pair
        )
        assert after - before == 1  # only the tiny one reached a replica
        # a long prompt the byte bound proves too long: refused without asking /tokenize
        status, _, body = http(
            "POST", gw.url + "/v1/completions", {"model": MODEL, "prompt": "x" * 1_500_000}
        )
        assert status == 400 and body["error"]["code"] == "context_length_exceeded"
        assert "at least" in body["error"]["message"]


# -- every error is OpenAI-shaped JSON ---------------------------------------------------------
def raw_http(port: int, request: bytes) -> tuple[int, dict, object]:
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(request)
        s.settimeout(10)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
        n = int(headers.get("Content-Length", "0"))
        while len(rest) < n:
            chunk = s.recv(65536)
            if not chunk:
                break
            rest += chunk
    try:
        body = json.loads(rest[:n])
    except ValueError:
        body = rest
    return int(lines[0].split()[1]), headers, body


def test_every_gateway_error_is_openai_json(pair):
    gw = gateway("--host", "0.0.0.0", "--admin-token", "ops", replicas=pair)
    with procs(gw):

        def wait_ready_open():
            return http("GET", gw.url + "/fleet", headers={"Authorization": "Bearer ops"})

        wait_for(
            lambda: [r["state"] for r in wait_ready_open()[2]["replicas"]].count("ready") == 2,
            20,
            "ready",
        )
        post = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        gz_lie = b'{"model": "m", "prompt": "x"}'
        cases = {
            "unknown route": b"GET /v2/nothing HTTP/1.1\r\nHost: x\r\n\r\n",
            "wrong method": b"GET /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n",
            "garbage request line": b"GARBAGE\r\n\r\n",
            "huge header": b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: "
            + b"a" * 20000
            + b"\r\n\r\n",
            "deep JSON": post + b"Content-Length: 200000\r\n\r\n" + b"[" * 100000 + b"]" * 100000,
            "invalid UTF-8": post + b"Content-Length: 4\r\n\r\n\xff\xfe{}",
            "not an object": post + b"Content-Length: 3\r\n\r\n[1]",
            "false gzip": post
            + b"Content-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(gz_lie)
            + gz_lie,
            "non-ASCII Authorization": post
            + "Authorization: Bearer ключ\r\n".encode()
            + b"Content-Length: 2\r\n\r\n{}",
            "fleet without the token": b"GET /fleet HTTP/1.1\r\nHost: x\r\n\r\n",
            "metrics without the token": b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
            "admin without the token": b"GET /admin/replicas HTTP/1.1\r\nHost: x\r\n\r\n",
        }
        for what, req in cases.items():
            status, headers, body = raw_http(gw.port, req)
            assert 400 <= status < 500, (what, status, body)
            openai_error(status, headers, body)
        # a real gzip body is read; a non-ASCII request id is replaced, not echoed or a 500
        gz = gzip.compress(json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 1}).encode())
        status, headers, body = raw_http(gw.port, post + b"Content-Encoding: gzip\r\nX-Request-Id: \xd0\xb8\xd0\xb4\r\n"
                                         b"Content-Length: %d\r\n\r\n" % len(gz) + gz)  # fmt: skip
        assert status == 200 and headers["X-Request-Id"].isascii(), body
        assert http("GET", gw.url + "/metrics", headers={"Authorization": "Bearer ops"})[0] == 200


# -- fuzz ------------------------------------------------------------------------------------
def test_fuzzed_bodies_never_get_a_5xx(pair):
    """Bodies drawn around vLLM's request schema (right and wrong types, lax strings, lone
    surrogates, extra fields): the gateway answers each, never with a 5xx."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    text = st.text(
        alphabet=st.characters(codec=None, min_codepoint=32, max_codepoint=0xDFFF), max_size=40
    )
    scalar = st.one_of(st.none(), st.booleans(), st.integers(-3, 40), st.floats(-3, 3, allow_nan=False),
                       text, st.sampled_from(["10", "no", "yes", "1e3", "", "null", "true"]))  # fmt: skip
    value = st.recursive(
        scalar,
        lambda c: st.lists(c, max_size=3) | st.dictionaries(text, c, max_size=3),
        max_leaves=6,
    )
    part = st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "image_url", 3])}, optional={"text": value}
    )
    message = st.fixed_dictionaries({}, optional={"role": st.sampled_from(["user", "assistant", "system", 5]),
                                                  "content": st.one_of(text, st.lists(part, max_size=2), value)})  # fmt: skip
    fields = [
        "model", "max_tokens", "n", "stream", "stream_options", "temperature", "top_p", "top_k", "stop",
        "seed", "user", "min_tokens", "ignore_eos", "echo", "logprobs", "priority", "prompt", "messages",
        "max_completion_tokens", "add_generation_prompt", "continue_final_message", "x-extra",
    ]  # fmt: skip
    good_message = st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system"]), "content": text}
    )
    weird = st.one_of(value, st.lists(message, max_size=2), st.lists(part, max_size=2))
    mutation = st.dictionaries(st.sampled_from(fields), weird, max_size=2)
    valid = {
        "/v1/completions": st.fixed_dictionaries(
            {"model": st.just(MODEL), "prompt": text.filter(bool), "max_tokens": st.integers(1, 8)},
            optional={"stream": st.booleans(), "n": st.integers(1, 2), "temperature": st.floats(0, 2)},
        ),
        "/v1/chat/completions": st.fixed_dictionaries(
            {"model": st.just(MODEL), "messages": st.lists(good_message, min_size=1, max_size=2),
             "max_tokens": st.integers(1, 8)},
            optional={"stream": st.booleans(), "n": st.integers(1, 2)},
        ),
    }  # fmt: skip
    gw = gateway("--set", "stream.idle_timeout=10", replicas=pair)
    seen: dict[int, int] = {}
    with procs(gw):
        wait_ready(gw, 2)

        @settings(
            max_examples=120,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
        )
        @given(data=st.data(), route=st.sampled_from(sorted(valid)), mutate=mutation)
        def one(data, route, mutate):
            body = {**data.draw(valid[route]), **mutate}
            raw = json.dumps(body).encode()  # lone surrogates stay escaped, as a client sends them
            status, headers, answer = raw_post(gw.url, route, raw)
            seen[status] = seen.get(status, 0) + 1
            assert status < 500, (body, status, answer)
            if status >= 400:
                openai_error(status, headers, answer)

        one()
    print("fuzz statuses:", dict(sorted(seen.items())))
    assert seen.get(200, 0) > 0 and seen.get(400, 0) > 0
