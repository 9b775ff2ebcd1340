"""`servefleet export nginx`: the exported nginx.conf run by a real nginx in front of real
sim-servers — loading, killed, capped, rate-limited — and its pure parts."""

from __future__ import annotations

import inspect
import json
import re
import shutil
import signal
import subprocess
import urllib.error
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import openai
import pytest
import yaml

from live_helpers import metric, served, start_nginx, start_sim, wait_until
from servefleet.fleet.commands import free_ports
from servefleet.fleet.export import nginx_conf
from servefleet.fleet.export_nginx import LONG_PROMPT_TOKENS, at_least_regex, nginx_files
from servefleet.gateway.config import AuthConfig, RateLimitConfig, TierLimits
from servefleet.gateway.identity import key_hash
from servefleet.routing import POLICIES
from test_export import make_fleet

needs_nginx = pytest.mark.skipif(shutil.which("nginx") is None, reason="nginx is not installed")


def test_at_least_regex_matches_the_plain_rule() -> None:
    for n in (0, 1, 9, 10, 99, 100, 101, 190, 999, 1000, 6000, 6001, 6099, 10000, 12345):
        rx = re.compile(at_least_regex(n))
        for k in range(0, 3 * n + 200):
            assert bool(rx.fullmatch(str(k))) == (k >= n), (n, k)
        assert rx.fullmatch(str(10 * n + 7)) and not rx.fullmatch(f"0{n}x")


def test_long_pool_threshold_is_the_length_pools_default() -> None:
    assert (
        inspect.signature(POLICIES["length-pools"]).parameters["threshold"].default
        == LONG_PROMPT_TOKENS
    )


def test_nginx_conf_carries_the_cap_the_limits_and_post_retries() -> None:
    fleet = make_fleet([8001, 8002, 8000], cap=24, rate_limit={"requests_per_second": 2})
    conf = nginx_conf(fleet)
    servers = [line for line in conf.splitlines() if line.strip().startswith("server 127")]
    assert len(servers) == 2 and all("max_conns=24 max_fails=3" in s for s in servers)
    assert "zone pool_default 64k;" in conf and "least_conn;" in conf
    assert "proxy_next_upstream error timeout http_502 http_503 non_idempotent;" in conf
    assert "limit_req_zone $servefleet_user zone=per_user:10m rate=2r/s;" in conf
    assert "limit_req zone=per_user burst=1 nodelay;" in conf  # 2 at once, as the gateway
    # nginx cannot verify keys: one address is also bounded (8 users' worth by default)
    assert "limit_req_zone $binary_remote_addr zone=per_address:10m rate=16r/s;" in conf
    assert "limit_req zone=per_address burst=15 nodelay;" in conf
    assert "# What the servefleet gateway does and nginx cannot" in conf
    unlimited = nginx_conf(make_fleet([8001, 8000], policy="session-hash"))
    assert " max_conns=" not in unlimited and "limit_req " not in unlimited
    assert "hash $servefleet_session consistent;" in unlimited
    slow = make_fleet([8001, 8000], rate_limit={"requests_per_second": 0.2, "burst": 3})
    assert "rate=12r/m" in nginx_conf(slow)


def test_nginx_upstream_names_stay_distinct_when_pool_names_differ_only_in_case(
    tmp_path: Path,
) -> None:
    conf = nginx_conf(make_fleet([8001, 8002, 8003, 8000], pools=["default", "Long", "long"]))
    names = re.findall(r"upstream (\S+) \{", conf)
    assert len(names) == 3 == len(set(names)), names
    (long_line,) = [line for line in conf.splitlines() if line.strip().startswith('"~^(')]
    assert long_line.split()[1].rstrip(";") in names
    if shutil.which("nginx"):
        (tmp_path / "nginx.conf").write_text(conf)
        check = subprocess.run(
            ["nginx", "-t", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf")],
            capture_output=True,
            text=True,
        )
        assert check.returncode == 0, check.stderr


def _post(url: str, body: dict, headers: dict[str, str]) -> tuple[int, dict, dict]:
    """(status, headers, JSON body) of a POST, errors included."""
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json", **headers}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.loads(e.read() or b"{}")


@needs_nginx
def test_nginx_conf_in_front_of_sim_servers(tmp_path: Path) -> None:
    with ExitStack() as stack:
        ports = [start_sim(tmp_path, str(i), stack, "--time-scale", "20")[1] for i in range(3)]
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        listen = free_ports(1)[0]
        fleet = make_fleet(
            [*ports, listen], pools=["default", "default", "long"], policy="session-hash"
        )
        start_nginx(tmp_path / "nginx", nginx_conf(fleet, listen=listen), stack, listen)
        base = f"http://127.0.0.1:{listen}"
        body = {"model": "Qwen2.5-7B", "prompt": "hello world", "max_tokens": 3}

        def batch(headers: dict, n: int, payload: dict) -> list[float]:
            before = [served(u) for u in urls]
            for _ in range(n):
                status, _, r = _post(base + "/v1/completions", payload, headers)
                assert status == 200 and r["usage"]["completion_tokens"] == 3, r
            return [served(u) - b for u, b in zip(urls, before, strict=True)]

        # each session sticks to one replica of the default pool
        for session in ("user-a", "user-b", "user-c"):
            delta = batch({"X-Session-Id": session}, 4, body)
            assert sorted(delta[:2]) == [0, 4] and delta[2] == 0, (session, delta)
        # requests without a session are spread (nginx's hash falls back to round robin)
        delta = batch({}, 6, body)
        assert delta[0] > 0 and delta[1] > 0 and delta[2] == 0, delta
        # a long prompt (by body size) goes to the long pool
        long = {**body, "prompt": "word " * 3000}
        assert batch({"X-Session-Id": "user-a"}, 1, long) == [0, 0, 1]
        # streaming passes through unbuffered
        req = urllib.request.Request(
            base + "/v1/completions",
            json.dumps({**body, "stream": True}).encode(),
            {"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            events = [x for x in r.read().decode().split("\n\n") if x.strip()]
        assert events[-1] == "data: [DONE]" and len(events) >= 4


@needs_nginx
def test_nginx_keeps_the_gateways_protections(tmp_path: Path) -> None:
    """Two replicas, one still loading (/health and /v1 answer 503): every POST is answered
    200 (retried on the other before the first byte); the cap holds; a user over their rate
    gets 429 from nginx; a killed replica is skipped."""
    with ExitStack() as stack:
        _, ready_port = start_sim(tmp_path, "ready", stack)
        loading_proc, loading_port = start_sim(tmp_path, "loading", stack, "--startup-time", "3600")
        ready = f"http://127.0.0.1:{ready_port}"
        listen = free_ports(1)[0]
        fleet = make_fleet(
            [ready_port, loading_port, listen],
            cap=2,
            # every client here is 127.0.0.1: its address bound must admit all the test's users
            rate_limit={"requests_per_second": 0.2, "burst": 3, "users_per_address": 100},
        )
        ng = start_nginx(tmp_path / "nginx", nginx_conf(fleet, listen=listen), stack, listen)
        base = f"http://127.0.0.1:{listen}"

        def chat(key: str) -> int:
            client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
            try:
                r = client.chat.completions.create(
                    model="Qwen2.5-7B",
                    messages=[{"role": "user", "content": "hello there"}],
                    max_tokens=3,
                )
            except openai.APIStatusError as e:
                return e.status_code
            assert r.usage.completion_tokens == 3
            return 200

        # 1. a POST to the loading replica (503) goes on to the ready one: 20 of 20 answered
        codes = [chat(f"key-{i}") for i in range(20)]
        assert codes == [200] * 20, codes
        sim_log = (tmp_path / "sim-loading.log").read_text()
        assert "ServiceUnavailableError" in sim_log  # the loading replica was tried
        assert served(ready) == 20

        # 2. per-user rate: 0.2 requests/s, 3 at once; the 4th of a burst gets nginx's 429
        got = [
            _post(base + "/v1/chat/completions", _chat_body(), {"Authorization": "Bearer k9"})
            for _ in range(5)
        ]
        assert [s for s, _, _ in got] == [200, 200, 200, 429, 429], [s for s, _, _ in got]
        status, headers, body = got[3]
        assert body["error"]["code"] == "rate_limit_exceeded" and headers["Retry-After"] == "5"
        assert chat("another-key") == 200  # other users are not limited
        # as at the gateway, /v1/models is under the same limits: k9's bucket is empty
        models = urllib.request.Request(base + "/v1/models", headers={"Authorization": "Bearer k9"})
        with pytest.raises(urllib.error.HTTPError) as limited:
            urllib.request.urlopen(models, timeout=10)
        assert limited.value.code == 429

        # 3. the cap: 2 streams fill the ready replica; a third request is refused at once
        streams = [_open_stream(base, f"s{i}") for i in range(2)]
        try:
            wait_until(lambda: metric(ready, "vllm:num_requests_running") == 2, "2 streams running")
            status, _, body = _post(
                base + "/v1/chat/completions", _chat_body(), {"Authorization": "Bearer s2"}
            )
            assert status == 503, body
            assert metric(ready, "vllm:num_requests_running") == 2  # never more than the cap
        finally:
            for s in streams:
                s.close()

        # 4. a killed replica (connection refused) is skipped too
        loading_proc.send_signal(signal.SIGKILL)
        loading_proc.wait(10)
        wait_until(lambda: metric(ready, "vllm:num_requests_running") == 0, "streams aborted")
        codes = [chat(f"after-kill-{i}") for i in range(10)]
        assert codes == [200] * 10, codes
        assert ng.poll() is None


def _chat_body(max_tokens: int = 3, stream: bool = False) -> dict:
    return {
        "model": "Qwen2.5-7B",
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


def _open_stream(base: str, key: str):
    """A chat stream left open after its first event (it runs on a replica meanwhile)."""
    req = urllib.request.Request(
        base + "/v1/chat/completions",
        json.dumps(_chat_body(max_tokens=2000, stream=True)).encode(),
        {"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    resp = urllib.request.urlopen(req, timeout=30)
    assert resp.status == 200
    resp.readline()
    return resp


@needs_nginx
def test_nginx_verifies_api_keys_limits_each_tier_and_proxies_only_openai_routes(
    tmp_path: Path,
) -> None:
    """fleet.yaml's keys file and tiers, exported: nginx hashes each bearer key (njs) and
    limits each known key in its tier's bucket; an invented key gets 401 (auth.required);
    only the OpenAI routes reach a replica; nginx listens on gateway.host only."""
    keys = [
        {"name": "alice", "sha256": key_hash("alice-key"), "tier": "free"},
        {"name": "bob", "sha256": key_hash("bob-key"), "tier": "pro"},
    ]
    (tmp_path / "keys.yaml").write_text(yaml.safe_dump({"keys": keys}))
    with ExitStack() as stack:
        _, port = start_sim(tmp_path, "a", stack)
        listen = free_ports(1)[0]
        fleet = make_fleet([port, listen])
        fleet.gateway.auth = AuthConfig(
            keys_file=str(tmp_path / "keys.yaml"), required=True, open_routes=["/v1/models"]
        )
        # `free` is not a listed tier: it has the default limits, as at the gateway
        fleet.gateway.rate_limit = RateLimitConfig(
            requests_per_second=0.01,
            request_burst=2,
            tiers={"pro": TierLimits(requests_per_second=0.01, request_burst=5)},
        )
        files = nginx_files(fleet, listen=listen)
        assert set(files) == {"nginx.conf", "servefleet.js", "servefleet-keys.map"}
        assert f"listen 127.0.0.1:{listen};" in files["nginx.conf"]
        prefix = tmp_path / "nginx"
        prefix.mkdir()
        for name in ("servefleet.js", "servefleet-keys.map"):
            (prefix / name).write_text(files[name])
        start_nginx(prefix, files["nginx.conf"], stack, listen)
        base = f"http://127.0.0.1:{listen}"

        def ask(key: str) -> int:
            return _post(
                base + "/v1/chat/completions", _chat_body(), {"Authorization": f"Bearer {key}"}
            )[0]

        assert [ask("alice-key") for _ in range(3)] == [200, 200, 429]
        assert [ask("bob-key") for _ in range(6)] == [200] * 5 + [429]  # his own bucket, of 5
        status, _, body = _post(base + "/v1/completions", {"model": "Qwen2.5-7B", "prompt": "x"},
                                {"Authorization": "Bearer invented"})  # fmt: skip
        assert status == 401 and body["error"]["code"] == "invalid_api_key"
        # what is not an OpenAI route of the gateway never reaches the replica
        for path in ("/metrics", "/tokenize", "/v1/embeddings", "/v1/responses", "/invocations"):
            status, _, body = _post(base + path, {}, {"Authorization": "Bearer bob-key"})
            assert status == 404 and body["error"]["code"] == "not_found", path
        # auth.open_routes: /v1/models answered to anyone, outside the limits
        models = urllib.request.Request(base + "/v1/models", headers={"Authorization": "Bearer x"})
        assert urllib.request.urlopen(models, timeout=10).status == 200
