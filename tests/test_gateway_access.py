"""Who may use which route, and what the gateway tells its logs and its replicas, with real
processes: every route behind the same identity and limits, operators' routes behind their
token whatever the bind address, clients' keys kept from replicas, strings that are not text
refused, and one JSON line per log record, never a traceback or a prompt."""

from __future__ import annotations

import json

import yaml

from scripted_upstream import ScriptedUpstream, replica_script
from test_gateway_support import (
    MODEL,
    gateway,
    http,
    procs,
    sim_server,
    states,
    wait_for,
    wait_ready,
)

ALICE = {"Authorization": "Bearer sk-alice"}


def keys_file(tmp_path):
    from servefleet.gateway.identity import key_hash

    keys = tmp_path / "keys.yaml"
    keys.write_text(yaml.safe_dump({"keys": [{"name": "alice", "sha256": key_hash("sk-alice")}]}))
    return keys


def test_tokenize_detokenize_and_models_are_behind_identity_and_rate_limits(tmp_path):
    rep = sim_server()
    with procs(rep):
        gw = gateway("--set", f"auth.keys_file={keys_file(tmp_path)}", "--set", "auth.required=true",
                     "--set", "rate_limit.requests_per_second=0.01", "--set", "rate_limit.request_burst=4",
                     replicas=[rep])  # fmt: skip
        with procs(gw):
            wait_ready(gw, 1)
            tok = {"model": MODEL, "prompt": "hello there"}
            detok = {"model": MODEL, "tokens": [1, 2, 3]}
            for route, body in (("/tokenize", tok), ("/detokenize", detok)):
                status, _, out = http("POST", gw.url + route, body)
                assert status == 401 and out["error"]["code"] == "invalid_api_key", out
            assert http("GET", gw.url + "/v1/models")[0] == 401
            assert http("GET", gw.url + "/health")[0] == 200  # probes stay open
            assert http("GET", gw.url + "/ready")[0] == 200
            # with a key: answered, and counted against its bucket like any request
            got = [http("POST", gw.url + "/tokenize", tok, ALICE)[0] for _ in range(3)]
            got.append(http("GET", gw.url + "/v1/models", headers=ALICE)[0])
            got.append(http("POST", gw.url + "/detokenize", detok, ALICE)[0])
            assert got == [200, 200, 200, 200, 429], got
        opened = gateway("--set", f"auth.keys_file={keys_file(tmp_path)}", "--set", "auth.required=true",
                         "--set", 'auth.open_routes=["/v1/models"]', replicas=[rep])  # fmt: skip
        with procs(opened):
            wait_ready(opened, 1)
            status, _, out = http("GET", opened.url + "/v1/models")
            assert status == 200 and out["data"][0]["id"] == MODEL
            assert http("POST", opened.url + "/tokenize", tok)[0] == 401


def test_operators_routes_need_the_token_whatever_the_bind_address():
    rep = sim_server()
    with procs(rep):
        gw = gateway("--admin-token", "s3cret", replicas=[rep])  # on loopback
        with procs(gw):
            ops = {"Authorization": "Bearer s3cret"}
            wait_for(lambda: http("GET", gw.url + "/fleet", headers=ops)[0] == 200, 20, "fleet")
            for path in ("/fleet", "/metrics", "/admin/replicas"):
                for headers in ({}, {"Authorization": "Bearer s3cre"}, {"Authorization": "s3cret"}):
                    status, _, out = http("GET", gw.url + path, headers=headers)
                    assert status == 401 and out["error"]["code"] == "unauthorized", (path, out)
                assert http("GET", gw.url + path, headers=ops)[0] == 200


def test_clients_keys_reach_replicas_only_when_configured():
    with ScriptedUpstream(replica_script(MODEL)) as up:
        for forward in (False, True):
            gw = gateway("--replica", up.url, "--set", f"auth.forward_client_key={forward}")
            with procs(gw):
                wait_for(lambda g=gw: list(states(g).values()) == ["ready"], 20, "ready")
                body = {"model": MODEL, "prompt": "hi", "max_tokens": 3}
                headers = {"Authorization": "Bearer client-secret"}
                assert http("POST", gw.url + "/v1/completions", body, headers)[0] == 200
                sent = [s for s in up.seen if s.path == "/v1/completions"][-1]
                assert sent.headers.get("authorization") == (
                    "Bearer client-secret" if forward else None
                )


def test_strings_that_are_not_text_anywhere_get_400_and_logs_stay_one_clean_line_each():
    rep = sim_server()
    with procs(rep):
        gw = gateway("--log-level", "info", replicas=[rep])
        with procs(gw):
            wait_ready(gw, 1)
            secret = "SECRET-PROMPT-TEXT"
            bodies = [
                {"model": MODEL, "messages": [{"role": "us\ud800er", "content": secret}]},
                {"model": MODEL, "messages": [{"role": "user", "content": secret}], "user": "\udfff"},
                {"model": MODEL, "messages": [{"role": "user", "content": secret}], "stop": ["\ud800"]},
                {"model": MODEL, "messages": [{"role": "user", "content": secret}], "x\ud800": 1},
            ]  # fmt: skip
            for body in bodies:
                raw = json.dumps(body).encode()  # ensure_ascii: the lone surrogates as \u escapes
                status, _, out = http("POST", gw.url + "/v1/chat/completions", raw)
                assert status == 400 and "surrogates not allowed" in out["error"]["message"], out
            for path in ("/tokenize", "/v1/completions"):
                raw = json.dumps({"model": MODEL, "prompt": "x", "user": "\ud800"}).encode()
                assert http("POST", gw.url + path, raw)[0] == 400
            # a body that is not what its Content-Encoding says
            lie = json.dumps({"model": MODEL, "prompt": secret}).encode()
            status, _, out = http("POST", gw.url + "/v1/completions", lie,
                                  {"Content-Encoding": "gzip"})  # fmt: skip
            assert status == 400, out
            log = gw.stderr()
            assert secret not in log and "Traceback" not in log
            for line in log.splitlines():
                assert isinstance(json.loads(line), dict), line


def test_keys_kept_in_redis_hold_through_a_redis_outage_and_unseen_ones_are_not_401s():
    import asyncio

    import pytest
    import redis.asyncio as aioredis

    from servefleet.gateway.config import AuthConfig
    from servefleet.gateway.errors import GatewayError
    from servefleet.gateway.identity import KeyStore, key_hash
    from test_gateway_support import Redis

    server = Redis()
    now = [0.0]

    async def go():
        client = aioredis.Redis.from_url(server.url, socket_timeout=0.25)
        await client.hset("keys", key_hash("sk-alice"), json.dumps({"name": "alice"}))
        strict = KeyStore(AuthConfig(redis_hash="keys", required=True), client, lambda: now[0])
        lax = KeyStore(AuthConfig(redis_hash="keys"), client, lambda: now[0])
        alice = "Bearer sk-alice"
        assert (await strict.identify(alice, {}, "10.0.0.1")).user == "key:alice"
        server.stop()
        now[0] = 3600.0  # long past the cache's freshness: Redis would be asked, and is down
        assert (await strict.identify(alice, {}, "10.0.0.1")).user == "key:alice"
        with pytest.raises(GatewayError) as err:
            await strict.identify("Bearer sk-never-seen", {}, "10.0.0.1")
        assert err.value.status == 503 and err.value.code == "auth_unavailable"
        assert (await lax.identify("Bearer sk-never-seen", {}, "10.0.0.1")).user == "ip:10.0.0.1"
        await client.aclose()

    try:
        asyncio.run(go())
    finally:
        if server.p.poll() is None:
            server.stop()
