"""The gateway in front of real sim-server processes: the API, routing, admission, rate
limits shared through a real Redis, run-time changes to the fleet, drain."""

from __future__ import annotations

import asyncio
import signal
import socket
from collections import Counter

import aiohttp
import openai
import pytest
import yaml

from test_gateway_support import (
    MODEL,
    Redis,
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
def three_replicas():
    servers = [sim_server() for _ in range(3)]
    try:
        yield servers
    finally:
        for s in servers:
            s.stop()


def name_of(p) -> str:
    return p.url.split("//")[1]


def test_openai_client_streams_and_not_through_the_gateway(three_replicas):
    gw = gateway(replicas=three_replicas)
    with procs(gw):
        wait_ready(gw, 3)
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="none", max_retries=0)
        assert [m.id for m in client.models.list().data] == [MODEL]
        r = client.completions.create(model=MODEL, prompt="one two three", max_tokens=7)
        assert len(r.choices[0].text.split()) == 7 and r.usage.completion_tokens == 7
        c = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=5
        )
        assert len(c.choices[0].message.content.split()) == 5
        pieces = []
        for ch in client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=9,
            stream=True,
            stream_options={"include_usage": True},
        ):
            if ch.choices and ch.choices[0].delta.content:
                pieces.append(ch.choices[0].delta.content)
            if ch.usage:
                assert ch.usage.completion_tokens == 9
        assert len("".join(pieces).split()) == 9
        text = "".join(
            ch.choices[0].text
            for ch in client.completions.create(
                model=MODEL, prompt="a b", max_tokens=6, stream=True
            )
        )
        assert len(text.split()) == 6
        # errors keep the OpenAI shape
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model="no-such-model", prompt="x", max_tokens=2)
        status, h, _ = http(
            "POST", gw.url + "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 2}
        )
        assert status == 200 and float(h["X-Servefleet-Queue-Time"]) >= 0
        assert h["X-Servefleet-Replica"] in {name_of(p) for p in three_replicas}
        f = fleet(gw)
        assert f["max_model_len"] == 4096 and len(f["replicas"]) == 3
        assert (
            http("GET", gw.url + "/health")[0] == 200 and http("GET", gw.url + "/ready")[0] == 200
        )


def test_ready_with_a_replica_still_loading_names_it(three_replicas, tmp_path):
    """Ready once a replica of every pool takes traffic; the others are named as missing."""
    loading = sim_server(startup=600.0)  # listens, answers /health 503 while "loading"
    ready = three_replicas[0]
    one_pool = tmp_path / "one.yaml"
    one_pool.write_text(yaml.safe_dump({"replicas": [{"url": ready.url}, {"url": loading.url}]}))
    two_pools = tmp_path / "two.yaml"
    two_pools.write_text(
        yaml.safe_dump({"replicas": [{"url": ready.url}, {"url": loading.url, "pool": "long"}]})
    )
    with procs(loading, gateway(config=one_pool), gateway(config=two_pools)) as (_, gw, gw2):
        wait_ready(gw, 1)
        status, _, body = http("GET", gw.url + "/ready")
        assert status == 200 and body["ready_replicas"] == [name_of(ready)]
        assert body["missing"] == [name_of(loading)]
        assert body["pools"] == {
            "default": {"ready": [name_of(ready)], "missing": [name_of(loading)]}
        }
        # the `long` pool has no replica that takes traffic: not ready, naming the one it lacks
        wait_ready(gw2, 1)
        status, _, body = http("GET", gw2.url + "/ready")
        assert status == 503 and not body["ready"]
        assert body["pools"]["long"] == {"ready": [], "missing": [name_of(loading)]}


def test_gateway_config_may_be_a_fleet_yaml(three_replicas, tmp_path):
    """`servefleet gateway --config fleet.yaml`: the fleet's `gateway:` section and its
    replicas, as `servefleet up` gives them; SIGHUP re-reads the fleet's replicas."""

    def replica(i: int) -> dict:
        port = int(three_replicas[i].url.rsplit(":", 1)[1])
        return {"name": f"r{i}", "tp": 1, "gpu_ids": [i], "port": port}

    fleet = {
        "model": {"name": MODEL, "path": "Qwen/Qwen2.5-7B-Instruct"},
        "engine": "sim",
        "gpus": {"type": "H200-SXM", "count": 8},
        "vllm": {"max_model_len": 4096, "max_num_seqs": 64, "max_num_batched_tokens": 2048},
        "replicas": [replica(0)],
        "gateway": {"auth": {"keys_file": keys_file(tmp_path, alice="default"), "required": True}},
    }
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(fleet))
    gw = gateway(config=path)
    with procs(gw):
        wait_ready(gw, 1)
        body = {"model": MODEL, "prompt": "x", "max_tokens": 2}
        assert http("POST", gw.url + "/v1/completions", body)[0] == 401  # the fleet's keys
        ok = http("POST", gw.url + "/v1/completions", body, {"Authorization": "Bearer sk-alice"})
        assert ok[0] == 200 and ok[1]["X-Servefleet-Replica"] == "r0"
        path.write_text(yaml.safe_dump({**fleet, "replicas": [replica(0), replica(1)]}))
        gw.signal(signal.SIGHUP)
        wait_ready(gw, 2)


def test_prompt_longer_than_max_model_len_is_refused_without_forwarding(three_replicas):
    gw = gateway(replicas=three_replicas)
    with procs(gw):
        wait_ready(gw, 3)
        before = sum(
            metric(http("GET", p.url + "/metrics")[2], "vllm:prompt_tokens_total")
            for p in three_replicas
        )
        long_prompt = " ".join(["word"] * 4100)
        status, _, body = http(
            "POST",
            gw.url + "/v1/completions",
            {"model": MODEL, "prompt": long_prompt, "max_tokens": 10},
        )
        assert status == 400 and body["error"]["code"] == "context_length_exceeded"
        assert "4096" in body["error"]["message"] and "4100" in body["error"]["message"]
        msgs = [{"role": "user", "content": " ".join(["w"] * 4000)}]
        status, _, body = http(
            "POST",
            gw.url + "/v1/chat/completions",
            {"model": MODEL, "messages": msgs, "max_tokens": 200},
        )
        assert status == 400 and body["error"]["param"] == "messages"
        # a long prompt that fits (by the replica's /tokenize: 3000 tokens) is served
        status, _, body = http("POST", gw.url + "/v1/completions",
                               {"model": MODEL, "prompt": " ".join(["word"] * 3000), "max_tokens": 2})  # fmt: skip
        assert status == 200, body
        after = sum(
            metric(http("GET", p.url + "/metrics")[2], "vllm:prompt_tokens_total")
            for p in three_replicas
        )
        assert after - before == 3000  # only the one that fits reached a replica
        status, _, body = http("POST", gw.url + "/v1/completions", {"model": MODEL, "prompt": 5})
        # vLLM's own refusal, as a replica would have answered it
        assert status == 400 and body["error"]["type"] == "Bad Request"
        assert body["error"]["param"].startswith("prompt") and body["error"]["code"] == 400
        big = gateway("--set", "admission.max_body_bytes=2048", replicas=three_replicas[:1])
        with procs(big):
            status, _, body = http(
                "POST", big.url + "/v1/completions", {"model": MODEL, "prompt": "x" * 5000}
            )
            assert status == 413 and body["error"]["code"] == "body_too_large"


def test_tokenize_and_detokenize_are_answered_by_a_replica(three_replicas):
    gw = gateway(replicas=three_replicas[:2])
    with procs(gw):
        wait_ready(gw, 2)
        body = {"model": MODEL, "prompt": "one two three four"}
        direct = http("POST", three_replicas[0].url + "/tokenize", body)[2]
        status, headers, got = http("POST", gw.url + "/tokenize", body)
        assert status == 200 and got == direct and got["count"] == 4
        assert headers["X-Servefleet-Replica"] in {name_of(p) for p in three_replicas[:2]}
        status, _, text = http(
            "POST", gw.url + "/detokenize", {"model": MODEL, "tokens": got["tokens"]}
        )
        assert status == 200 and text["prompt"].split() == ["one", "two", "three", "four"]
        status, _, err = http("POST", gw.url + "/tokenize", {"model": "nope", "prompt": "x"})
        assert status == 404 and err["error"]["code"] == "model_not_found"
    loading = sim_server(startup=60.0)
    with procs(loading):
        gw = gateway(replicas=[loading])
        with procs(gw):
            assert states(gw)[loading.url] == "starting"
            status, _, err = http("POST", gw.url + "/tokenize", body)
            assert status == 503 and err["error"]["code"] == "no_replica"


def test_sessions_stay_on_one_replica_within_the_load_bound(three_replicas):
    gw = gateway("--policy", "session-hash", replicas=three_replicas)
    with procs(gw):
        wait_ready(gw, 3)
        homes = {}
        for turn in range(4):
            for s in range(12):
                body = {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": f"turn {turn}"}],
                    "max_tokens": 3,
                }
                status, h, _ = http(
                    "POST", gw.url + "/v1/chat/completions", body, {"X-Session-ID": f"session-{s}"}
                )
                assert status == 200
                homes.setdefault(s, set()).add(h["X-Servefleet-Replica"])
        assert all(
            len(v) == 1 for v in homes.values()
        )  # one request at a time: never over the bound
        assert len({next(iter(v)) for v in homes.values()}) >= 2  # keys spread over replicas

        # under concurrency one hot session spills over once its home is above c x average
        async def burst():
            async with aiohttp.ClientSession() as s:

                async def one():
                    async with s.post(gw.url + "/v1/completions", json={"model": MODEL, "prompt": "p", "max_tokens": 40,
                                      "ignore_eos": True}, headers={"X-Session-ID": "hot"}) as r:  # fmt: skip
                        await r.read()
                        return r.headers["X-Servefleet-Replica"]

                return await asyncio.gather(*(one() for _ in range(30)))

        spread = Counter(asyncio.run(burst()))
        assert len(spread) >= 2
        assert (
            metric(metrics(gw), "servefleet_gateway_routing_decisions_total", policy="session-hash")
            >= 78
        )


@pytest.mark.parametrize("policy", ["least-outstanding", "predicted-latency"])
def test_a_slowed_replica_gets_less_traffic(policy):
    fast = [sim_server(time_scale=2.0), sim_server(time_scale=2.0)]
    slow = sim_server("--fault-slowdown", "5", time_scale=2.0)
    with procs(*fast, slow):
        cfg = [{"url": p.url, "model": MODEL, "gpu": "H200-SXM"} for p in (*fast, slow)]
        flow = yaml.safe_dump(cfg, default_flow_style=True, width=10_000).strip()
        gw = gateway("--policy", policy, "--set", f"replicas={flow}")
        with procs(gw):
            wait_ready(gw, 3)

            async def closed_loop(n_users: int, per_user: int) -> Counter:
                got: Counter = Counter()
                async with aiohttp.ClientSession() as s:

                    async def user(u: int):
                        for i in range(per_user):
                            body = {
                                "model": MODEL,
                                "prompt": f"user {u} request {i} " * 20,
                                "max_tokens": 24,
                                "ignore_eos": True,
                            }
                            async with s.post(gw.url + "/v1/completions", json=body) as r:
                                await r.read()
                                assert r.status == 200
                                got[r.headers["X-Servefleet-Replica"]] += 1

                    await asyncio.gather(*(user(u) for u in range(n_users)))
                return got

            got = asyncio.run(asyncio.wait_for(closed_loop(9, 8), 60))
            assert sum(got.values()) == 72
            fast_mean = sum(got[name_of(p)] for p in fast) / 2
            assert got[name_of(slow)] < 0.6 * fast_mean, got


def test_overload_yields_429s_and_every_request_is_accounted_for(three_replicas):
    gw = gateway(
        "--set", "admission.max_concurrency=4", "--set", "admission.max_queue=6",
        "--set", "admission.max_queue_wait=0.3", replicas=three_replicas,
    )  # fmt: skip
    with procs(gw):
        wait_ready(gw, 3)

        async def flood():
            async with aiohttp.ClientSession() as s:

                async def one(i):
                    body = {
                        "model": MODEL,
                        "prompt": f"q {i}",
                        "max_tokens": 80,
                        "ignore_eos": True,
                        "stream": i % 2 == 0,
                    }
                    async with s.post(gw.url + "/v1/completions", json=body) as r:
                        data = await r.read()
                        return r.status, r.headers.get("Retry-After"), data

                return await asyncio.gather(*(one(i) for i in range(60)))

        results = asyncio.run(flood())
        codes = Counter(s for s, _, _ in results)
        assert codes[429] > 0 and codes[200] >= 4, codes
        assert set(codes) <= {200, 429, 503}, codes
        assert all(ra is not None and int(ra) >= 1 for s, ra, _ in results if s in (429, 503))
        assert all(b'"queue_full"' in d for s, _, d in results if s == 429)
        m = metrics(gw)
        assert metric(m, "servefleet_gateway_requests_total") == 60
        for code, n in codes.items():
            assert metric(m, "servefleet_gateway_requests_total", status=str(code)) == n
        assert metric(m, "servefleet_gateway_rejected_total", reason="queue_full") == codes[429]
        assert metric(m, "servefleet_gateway_requests_in_flight") == 0


def keys_file(tmp_path, **tiers: str) -> str:
    """A keys file: for each name, the key ``sk-NAME`` in the given tier."""
    from servefleet.gateway.identity import key_hash

    keys = [{"name": n, "sha256": key_hash(f"sk-{n}"), "tier": t} for n, t in tiers.items()]
    path = tmp_path / "keys.yaml"
    path.write_text(yaml.safe_dump({"keys": keys}))
    return str(path)


def test_two_gateways_share_rate_limits_through_redis(three_replicas, tmp_path):
    """Through a Redis with a password, read from a file (as the exports mount it)."""
    redis = Redis()
    try:
        with socket.create_connection(("127.0.0.1", redis.port), timeout=5) as s:
            s.sendall(b"CONFIG SET requirepass s3cret\r\n")
            assert s.recv(16).startswith(b"+OK")
        (tmp_path / "redis-password").write_text("s3cret\n")
        common = [
            "--set", f"rate_limit.redis_url={redis.url}", "--set", "rate_limit.requests_per_second=0.05",
            "--set", f"rate_limit.redis_password_file={tmp_path / 'redis-password'}",
            "--set", "rate_limit.request_burst=6", "--set", "auth.keys_file=" + keys_file(tmp_path, alice="default", bob="default"),
        ]  # fmt: skip
        a = gateway(*common, replicas=three_replicas)
        b = gateway(*common, replicas=three_replicas)
        with procs(a, b):
            wait_ready(a, 3)
            wait_ready(b, 3)
            got = []
            for i in range(12):
                gw = (a, b)[i % 2]
                status, h, body = http("POST", gw.url + "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 2},
                                       {"Authorization": "Bearer sk-alice", "X-User-ID": f"forged-{i}"})  # fmt: skip
                got.append(status)
                if status == 429:
                    assert (
                        body["error"]["code"] == "rate_limit_exceeded"
                        and int(h["Retry-After"]) >= 1
                    )
            # one bucket of 6 for both gateways, whatever X-User-ID says
            assert got.count(200) == 6 and got.count(429) == 6
            rl = http("GET", a.url + "/ready")[2]["rate_limit"]
            assert rl["backend"] == "redis" and "degraded" not in rl, rl
            status, _, _ = http("POST", b.url + "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 2},
                                {"Authorization": "Bearer sk-bob"})  # fmt: skip
            assert status == 200  # another key, another bucket
    finally:
        redis.stop()


def test_tokens_per_minute_limit_in_memory(three_replicas):
    gw = gateway("--set", "rate_limit.tokens_per_minute=100", replicas=three_replicas)
    with procs(gw):
        wait_ready(gw, 3)
        body = {"model": MODEL, "prompt": "a b c d", "max_tokens": 30}
        statuses = [
            http("POST", gw.url + "/v1/completions", body, {"X-User-ID": "u"})[0] for _ in range(4)
        ]
        assert statuses == [200, 200, 200, 429]  # 3 x (1 + 30) tokens fit in 100


def test_replicas_added_and_removed_at_run_time_without_dropping_requests(tmp_path):
    a, b = sim_server(time_scale=2.0), sim_server()
    with procs(a, b):
        cfg = tmp_path / "gw.yaml"
        cfg.write_text(
            yaml.safe_dump({"replicas": [{"url": a.url, "name": "a"}], "admin_token": "t0k"})
        )
        gw = gateway(config=cfg)
        auth = gw.ops = {"Authorization": "Bearer t0k"}
        with procs(gw):
            wait_ready(gw, 1)
            assert http("POST", gw.url + "/admin/replicas", {"url": b.url, "name": "b"})[0] == 401
            status, _, body = http(
                "POST", gw.url + "/admin/replicas", {"url": b.url, "name": "b"}, auth
            )
            assert status == 200 and body == {"added": "b"}
            wait_ready(gw, 2)

            async def long_stream_while_removing():
                async with aiohttp.ClientSession() as s:
                    r = await s.post(gw.url + "/v1/completions", json={"model": MODEL, "prompt": "keep going", "max_tokens": 150,
                                     "ignore_eos": True, "stream": True}, headers={"X-Session-ID": "x"})  # fmt: skip
                    assert r.headers["X-Servefleet-Replica"] in ("a", "b")
                    victim = r.headers["X-Servefleet-Replica"]
                    await r.content.readline()
                    async with s.delete(gw.url + f"/admin/replicas/{victim}", headers=auth) as d:
                        assert d.status == 200 and (await d.json())["draining"] == victim
                    text = await r.read()
                    return victim, text

            victim, text = asyncio.run(long_stream_while_removing())
            assert text.rstrip().endswith(b"data: [DONE]") and b"error" not in text
            wait_for(
                lambda: victim not in [r["name"] for r in fleet(gw)["replicas"]],
                5,
                "the drained replica to go",
            )
            # config reload (SIGHUP) puts back both
            cfg.write_text(yaml.safe_dump({"replicas": [{"url": a.url, "name": "a"}, {"url": b.url, "name": "b"}],
                                           "admin_token": "t0k"}))  # fmt: skip
            gw.signal(signal.SIGHUP)
            wait_for(
                lambda: sorted(r["name"] for r in fleet(gw)["replicas"]) == ["a", "b"], 5, "reload"
            )
            wait_ready(gw, 2)
            status, _, body = http("POST", gw.url + "/admin/reload", None, auth)
            assert status == 200 and body == {"added": [], "removed": [], "updated": []}


def test_graceful_drain_finishes_streams_in_flight():
    rep = sim_server(time_scale=2.0)
    with procs(rep):
        gw = gateway(replicas=[rep])
        with procs(gw):
            wait_ready(gw, 1)

            async def go():
                async with aiohttp.ClientSession() as s:
                    r = await s.post(gw.url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 120,
                                     "ignore_eos": True, "stream": True})  # fmt: skip
                    await r.content.readline()
                    gw.signal(signal.SIGTERM)
                    return await r.read()

            text = asyncio.run(go())
            assert text.rstrip().endswith(b"data: [DONE]")
            assert gw.p.wait(10) == 0
