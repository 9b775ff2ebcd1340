"""The gateway's parts on their own: breaker, admission queue, token buckets, request parsing,
stream resumption, configuration errors."""

from __future__ import annotations

import asyncio
import json

import pytest

from servefleet.gateway.admission import Admission
from servefleet.gateway.breaker import CLOSED, HALF_OPEN, OPEN, CircuitBreaker
from servefleet.gateway.cli import build_config
from servefleet.gateway.config import ConfigError, RateLimitConfig, load_config, parse_config
from servefleet.gateway.errors import GatewayError
from servefleet.gateway.parse import CHAT, COMPLETIONS, load_json, parse_request, resume_body
from servefleet.gateway.ratelimit import MemoryLimiter, tier_limits
from servefleet.gateway.scrape import parse_vllm_metrics
from servefleet.gateway.sse import Resumed, StreamLog


def test_breaker_opens_after_consecutive_failures_and_backs_off():
    b = CircuitBreaker(threshold=3, base_ejection=1.0, max_ejection=3.0)
    assert not b.record_failure(0.0) and not b.record_failure(0.0)
    b.record_success()  # not consecutive any more
    assert not b.record_failure(0.0) and not b.record_failure(0.0)
    assert b.record_failure(0.0) and b.state == OPEN
    assert not b.allows(0.5)
    assert b.allows(1.0) and b.state == HALF_OPEN
    b.on_sent()
    assert not b.allows(1.0)  # one trial at a time
    assert b.record_failure(1.1) and b.state == OPEN and b.open_until == pytest.approx(3.1)
    assert b.allows(3.1)
    b.on_sent()
    assert b.record_failure(3.2) and b.open_until == pytest.approx(6.2)  # capped at 3 s
    assert b.allows(7.0)
    assert b.record_success() and b.state == CLOSED and b.ejections == 0


def test_admission_is_fifo_bounded_and_times_out():
    async def main():
        adm = Admission(max_concurrency=2, max_queue=2, max_wait=0.2)
        assert await adm.acquire() == 0.0 and await adm.acquire() == 0.0
        order = []

        async def waiter(i):
            await adm.acquire()
            order.append(i)

        w = [asyncio.create_task(waiter(i)) for i in range(2)]
        await asyncio.sleep(0)
        assert adm.queued == 2
        with pytest.raises(GatewayError) as full:
            await adm.acquire()
        assert full.value.status == 429 and full.value.code == "queue_full"
        adm.release()
        adm.release()
        await asyncio.gather(*w)
        assert order == [0, 1] and adm.active == 2
        with pytest.raises(GatewayError) as late:
            await adm.acquire()
        assert late.value.status == 503 and late.value.code == "queue_timeout"
        assert adm.queued == 0 and adm.active == 2
        adm.release()
        adm.release()
        assert adm.active == 0

    asyncio.run(main())


def test_memory_token_buckets_for_requests_and_tokens():
    cfg = RateLimitConfig(
        requests_per_second=2, request_burst=2, tokens_per_minute=600,
        tiers={"gold": {"requests_per_second": 10, "request_burst": 5}},
    )  # fmt: skip
    tiers = tier_limits(cfg)
    d = tiers["default"]
    lim = MemoryLimiter()
    assert lim.check_now("a", 10, d, 0.0).allowed and lim.check_now("a", 10, d, 0.0).allowed
    v = lim.check_now("a", 10, d, 0.0)
    assert not v.allowed and v.which == "requests" and v.retry_after == pytest.approx(0.5)
    assert lim.check_now("b", 10, d, 0.0).allowed  # per user
    assert lim.check_now("a", 10, d, 0.5).allowed
    v = lim.check_now("c", 590, d, 0.0)
    assert v.allowed
    v = lim.check_now("c", 20, d, 0.0)
    assert not v.allowed and v.which == "tokens" and v.retry_after == pytest.approx(1.0)  # 10/s
    # a tier of its own: 5 at once
    assert sum(lim.check_now("g", 1, tiers["gold"], 0.0).allowed for _ in range(8)) == 5


def test_parse_reads_bodies_as_vllm_does():
    p = parse_request(
        COMPLETIONS, {"model": "m", "prompt": "a b c", "max_tokens": 5, "stream": True, "user": "u"}
    )
    assert (p.stream, p.model, p.max_tokens, p.req.user, p.resumable) == (True, "m", 5, "u", True)
    assert p.longest_bytes == 5 and p.token_estimate == 2
    c = parse_request(CHAT, {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                             "max_completion_tokens": 7})  # fmt: skip
    assert c.max_tokens == 7 and c.prompt_text == "user\nhi\n" and c.resumable
    assert not parse_request(COMPLETIONS, {"prompt": ["a", "b"]}).resumable
    assert not parse_request(COMPLETIONS, {"prompt": "a", "n": 2}).resumable
    assert parse_request(COMPLETIONS, {"prompt": [1, 2, 3]}).prompt_ids == [1, 2, 3]
    # lax types, as vLLM's pydantic reads them: "9" is 9, "no" is false
    lax = parse_request(COMPLETIONS, {"prompt": "x", "max_tokens": "9", "n": "1", "stream": "no"})
    assert (lax.max_tokens, lax.req.n, lax.stream) == (9, 1, False)
    assert parse_request(COMPLETIONS, {"prompt": "x"}).max_tokens == 16  # vLLM's default
    # each prompt of a list counts alone against max_model_len: the longest one
    many = parse_request(COMPLETIONS, {"prompt": ["abc", "abcdef", "a"]})
    assert many.longest_bytes == 6 and many.token_estimate == 3
    for bad, kind, vllm_type in (
        ({"prompt": 5}, COMPLETIONS, "Bad Request"),
        ({"messages": []}, CHAT, "Bad Request"),
        ({"prompt": "x", "max_tokens": "nine"}, COMPLETIONS, "Bad Request"),
        ({"prompt": "x", "stream": "maybe"}, COMPLETIONS, "Bad Request"),
        ({"prompt": "a\ud800b"}, COMPLETIONS, "BadRequestError"),
        ({"prompt": "x", "temperature": -1}, COMPLETIONS, "BadRequestError"),
        ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, CHAT, "BadRequestError"),
    ):
        with pytest.raises(GatewayError) as e:
            parse_request(kind, bad)
        err = e.value.body()["error"]
        assert e.value.status == 400 and err["type"] == vllm_type and err["code"] == 400, bad
    with pytest.raises(GatewayError) as e:
        parse_request(COMPLETIONS, {"prompt": "a\ud800b"})
    assert e.value.message == (
        "'utf-8' codec can't encode character '\\ud800' in position 1: surrogates not allowed"
    )
    with pytest.raises(GatewayError):
        load_json(b"{not json")
    with pytest.raises(GatewayError):
        load_json(b"[" * 100_000 + b"]" * 100_000)


def test_resume_body_continues_where_the_client_is():
    p = parse_request(COMPLETIONS, {"prompt": "Once upon", "max_tokens": "10", "min_tokens": 4})
    b = resume_body(p, " a time", 2)
    assert b["prompt"] == "Once upon a time" and b["max_tokens"] == 8 and b["min_tokens"] == 2
    assert b["stream"] is True
    # no max_tokens: vLLM's 16 for completions, of which 2 are spent
    assert resume_body(parse_request(COMPLETIONS, {"prompt": "x"}), " y", 2)["max_tokens"] == 14
    c = parse_request(CHAT, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10})
    b = resume_body(c, "Hello there", 2)
    assert b["messages"][-1] == {"role": "assistant", "content": "Hello there"}
    assert b["continue_final_message"] is True and b["add_generation_prompt"] is False
    assert c.body["messages"] == [{"role": "user", "content": "hi"}]  # the original is kept


def test_stream_log_and_resumed_rewrite():
    log = StreamLog()
    role = b'data: {"id":"x","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
    tok = b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"Hello"}}]}\n\n'
    log.add(role + tok)
    log.add(
        b'data: {"id":"x","choices":[{"index":0,"delta":{"content":" world"},"finish_reason":null}]}\n\n'
    )
    s = log.summary()
    assert (s.text, s.content_events, s.finish_reason, s.done) == ("Hello world", 2, None, False)
    r = Resumed(chat=True, tokens_before=2)
    assert r.rewrite(role.strip()) is None
    assert r.rewrite(tok.strip()) == tok.strip()
    usage = b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}}'
    u = json.loads(r.rewrite(usage)[6:])["usage"]
    assert u == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}


def test_config_errors_name_the_field(tmp_path):
    with pytest.raises(ConfigError, match=r"replicas\.0\.url"):
        parse_config({"replicas": [{"url": "ftp://x"}]})
    with pytest.raises(ConfigError, match=r"health\.interval"):
        parse_config({"health": {"interval": 0}})
    with pytest.raises(ConfigError, match="unique"):
        parse_config({"replicas": [{"url": "http://a:1"}, {"url": "http://a:1"}]})
    f = tmp_path / "g.yaml"
    f.write_text("replicas: [\n")
    with pytest.raises(ConfigError, match=r"g\.yaml:2: invalid YAML"):
        load_config(f)
    f.write_text("replicas:\n  - url: http://a:1\nhealth:\n  interval: 0\n")
    with pytest.raises(ConfigError, match=r"g\.yaml: line 4: health\.interval"):
        load_config(f)
    with pytest.raises(ConfigError, match="no replicas"):
        build_config(None, [], None, None, None, None, None, [])
    with pytest.raises(ConfigError, match="unknown routing policy"):
        build_config(None, ["http://a:1"], "nope", None, None, None, None, [])
    cfg = build_config(None, ["http://a:1"], "prefix-affinity", None, 0, None, None,
                       ["policy.options.load_factor=2", "admission.max_queue=3"])  # fmt: skip
    assert (
        cfg.policy.options == {"load_factor": 2} and cfg.admission.max_queue == 3 and cfg.port == 0
    )


def test_vllm_metrics_are_read_by_name():
    text = (
        '# HELP vllm:prefix_cache_hits_total x\nvllm:prefix_cache_hits_total{model_name="m"} 120.0\n'
        'vllm:prefix_cache_queries_total{model_name="m"} 400.0\nvllm:num_requests_waiting{model_name="m"} 3.0\n'
    )
    assert parse_vllm_metrics(text) == {
        "prefix_cache_hits": 120.0, "prefix_cache_queries": 400.0, "num_requests_waiting": 3.0,
    }  # fmt: skip


def test_router_panics_when_too_few_replicas_are_healthy():
    from servefleet.gateway.config import ReplicaConfig
    from servefleet.gateway.replica import HEALTHY, STARTING, UNHEALTHY, Replica, ReplicaSet
    from servefleet.gateway.router import Router
    from servefleet.routing import RequestContext, make_policy

    cfg = parse_config({})
    reps = ReplicaSet(cfg)
    for name, health in (("a", HEALTHY), ("b", UNHEALTHY), ("c", UNHEALTHY), ("d", STARTING)):
        r = Replica(ReplicaConfig(url=f"http://{name}:1", name=name), cfg)
        r.health = health
        reps._replicas[name] = r
    router = Router(reps, make_policy("round-robin"), panic_threshold=0.5)
    ctx = RequestContext("x", 10, 10)
    picks = {router.choose(ctx, None, set())[0].name for _ in range(6)}
    assert router.panic and picks == {"a", "b", "c"}  # 1 of 3 healthy: the ejected ones too
    reps.get("b").health = HEALTHY
    picks = {router.choose(ctx, None, set())[0].name for _ in range(6)}
    assert not router.panic and picks == {"a", "b"}  # never the one still starting


def test_retry_plan_blames_replica_faults_only_and_stops_a_request_that_fails_alike():
    from servefleet.gateway.retry import (
        FAULT,
        GIVE_UP,
        OVERLOADED,
        POISON,
        RESUME,
        RETRY,
        Failure,
        RetryPlan,
    )

    def plan() -> RetryPlan:
        return RetryPlan(max_attempts=3, max_resumes=1, backoff_base=0.01, backoff_max=0.04)

    # a 500 on a, then b succeeds: a was at fault
    p = plan()
    s = p.after(Failure("a", FAULT, "http 500: boom"), 0.0)
    assert s.action == RETRY and s.blame == () and s.delay == 0.005
    assert p.settled() == ("a",)
    # the same 500, or the same cut, on a then b: the request's own; nobody blamed, no third
    p = plan()
    p.after(Failure("a", FAULT, "http 500: boom"), 0.0)
    assert p.after(Failure("b", FAULT, "http 500: boom"), 0.0).action == POISON
    p = plan()
    p.after(Failure("a", FAULT, "disconnected"), 0.0)
    s = p.after(Failure("b", FAULT, "disconnected"), 0.0)
    assert s.action == POISON and s.blame == () and p.settled() == ()
    # different faults: each replica blamed once it is clear; attempts run out: give up
    p = plan()
    p.after(Failure("a", FAULT, "timeout"), 0.5)
    s = p.after(Failure("b", FAULT, "http 502: x"), 0.5)
    assert (
        s.action == RETRY and s.blame == ("a",) and s.delay == pytest.approx(0.015)
    )  # 0.01 x 2, jittered x 0.75
    s = p.after(Failure("c", FAULT, "eof"), 0.5)
    assert s.action == GIVE_UP and s.blame == ("b", "c")
    # a connection refused is blamed at once; overload never; all overloaded says so
    p = plan()
    assert p.after(Failure("a", FAULT, "connect_error", connect=True), 0.0).blame == ("a",)
    q = plan()
    for r in "abc":
        s = q.after(Failure(r, OVERLOADED, "http 503"), 0.0)
    assert s.action == GIVE_UP and s.blame == () and q.all_overloaded
    # mid-stream: resume while resumes last, then give up
    p = plan()
    assert p.after(Failure("a", FAULT, "disconnected", mid_stream=True), 0.0).action == RESUME
    assert p.settled() == ("a",)
    assert p.after(Failure("b", FAULT, "timeout", mid_stream=True), 0.0).action == GIVE_UP


def test_connect_errors_use_up_no_attempt_or_resumption_but_are_bounded_by_the_replicas():
    from servefleet.gateway.retry import FAULT, GIVE_UP, RESUME, RETRY, Failure, RetryPlan

    p = RetryPlan(max_attempts=1, max_resumes=1, backoff_base=0.01, backoff_max=0.04, replicas=3)
    # mid-stream: the cut counts as the resumption; refused connections after it do not
    assert p.after(Failure("a", FAULT, "disconnected", mid_stream=True), 0.0).action == RESUME
    s = p.after(Failure("b", FAULT, "connect_error", mid_stream=True, connect=True), 0.0)
    assert s.action == RESUME and s.blame == ("b",) and p.resumes == 1
    # but never more refused connections than there are replicas
    s = p.after(Failure("c", FAULT, "connect_error", mid_stream=True, connect=True), 0.0)
    assert s.action == RESUME
    s = p.after(Failure("a", FAULT, "connect_error", mid_stream=True, connect=True), 0.0)
    assert s.action == GIVE_UP
    # before the first byte: one attempt allowed, yet two replicas refusing still leave the third
    p = RetryPlan(max_attempts=1, max_resumes=0, backoff_base=0.01, backoff_max=0.04, replicas=3)
    for r in "ab":
        s = p.after(Failure(r, FAULT, "connect_error", connect=True), 0.0)
        assert s.action == RETRY and s.delay == 0.0


def test_a_stream_without_its_first_event_past_its_deadline_finds_its_replica_hung():
    from servefleet.gateway.config import GatewayConfig, ReplicaConfig, StreamConfig
    from servefleet.gateway.replica import Replica
    from servefleet.gateway.watchdog import first_token_limit, first_token_overdue

    cfg = StreamConfig(first_token_factor=10, min_first_token=5.0, idle_timeout=60)
    assert first_token_limit(cfg, 0.0) == 60.0  # nothing learned yet: idle_timeout alone
    assert first_token_limit(cfg, 0.1) == 5.0  # the floor
    assert first_token_limit(cfg, 0.8) == 8.0
    assert first_token_limit(cfg, 30.0) == 60.0

    async def go():
        rep = Replica(ReplicaConfig(url="http://127.0.0.1:9"), GatewayConfig())
        rep.learn_ttft(0.1, 100)
        rep.learn_ttft(0.3, 100)
        assert rep.ttft == pytest.approx(0.12) and rep.expected_ttft(10_000) == pytest.approx(12)

        class Waiting:
            waiting_since, first_deadline = 100.0, 5.0

            def abort(self, why: str) -> None: ...

        rep.attempts.add(Waiting())
        assert first_token_overdue(rep, 104.0) is None
        assert first_token_overdue(rep, 106.0) == 6.0
        rep.progress_at = 103.0  # another stream's event: the replica works, this one queues
        assert first_token_overdue(rep, 106.0) is None
        await rep.close()

    asyncio.run(go())


def test_stream_logs_are_kept_only_while_a_stream_can_resume_and_are_bounded():
    log = StreamLog(10)
    log.add(b"abcd")
    assert log.kept and log.started and log.chunks == [b"abcd"]
    log.add(b"efghijk")
    assert not log.kept and log.chunks == [] and log.started and log.size == 11
    none = StreamLog(0)  # a stream that cannot resume keeps nothing
    none.add(b"abc")
    assert not none.kept and none.chunks == [] and none.started


def test_breaker_trips_at_once_on_a_sure_fault():
    b = CircuitBreaker(threshold=5, base_ejection=2.0)
    assert b.trip(10.0) and b.state == OPEN and b.open_until == 12.0
    assert not b.trip(11.0)  # already open
    assert b.allows(12.5) and b.state == HALF_OPEN


def test_a_replica_is_hung_when_all_its_streams_go_quiet():
    from servefleet.gateway.config import StreamConfig
    from servefleet.gateway.watchdog import stall_limit

    cfg = StreamConfig(stall_factor=25, min_stall=2.0, idle_timeout=60)
    assert stall_limit(cfg, 0.0) == 2.0  # nothing learned yet: the floor
    assert stall_limit(cfg, 0.2) == 5.0  # 25 x a 0.2 s gap
    assert stall_limit(cfg, 10.0) == 60.0  # never beyond idle_timeout


def test_identity_comes_from_known_keys_never_from_what_a_client_says(tmp_path):
    import yaml

    from servefleet.gateway.config import AuthConfig
    from servefleet.gateway.identity import Identity, KeyStore, key_hash

    keys = tmp_path / "k.yaml"
    keys.write_text(
        yaml.safe_dump({"keys": [{"name": "al", "sha256": key_hash("sk-al"), "tier": "gold"}]})
    )

    class FakeRedis:
        async def hget(self, name, field):
            assert name == "keys"
            return b'{"name": "bo", "tier": "silver"}' if field == key_hash("sk-bo") else None

    async def main():
        ks = KeyStore(AuthConfig(keys_file=str(keys), redis_hash="keys"), FakeRedis())
        h = {"X-User-ID": "mallory"}
        assert (await ks.identify("Bearer sk-al", h, "10.0.0.9")) == Identity("key:al", "gold")
        assert (await ks.identify("Bearer sk-bo", h, "10.0.0.9")) == Identity("key:bo", "silver")
        assert (await ks.identify("Bearer made-up", h, "10.0.0.9")).user == "ip:10.0.0.9"
        trusting = KeyStore(AuthConfig(user_header="X-User-ID", trusted_proxies=["10.0.0.0/8"]))
        assert (await trusting.identify(None, h, "10.0.0.9")).user == "user:mallory"
        assert (await trusting.identify(None, h, "192.0.2.1")).user == "ip:192.0.2.1"
        strict = KeyStore(AuthConfig(keys_file=str(keys), required=True))
        with pytest.raises(GatewayError) as e:
            await strict.identify("Bearer nope", h, "10.0.0.9")
        assert e.value.status == 401

    asyncio.run(main())


def test_an_empty_admin_token_turns_the_admin_endpoints_off() -> None:
    """An unset container variable arrives as "": it must never match `Bearer ` alone."""
    assert parse_config({"admin_token": ""}, "t").admin_token is None
    assert parse_config({"admin_token": "  "}, "t").admin_token is None
    assert parse_config({"admin_token": "s3cret"}, "t").admin_token == "s3cret"


def test_fleet_describes_what_each_replica_runs() -> None:
    """GET /fleet carries the replica's model, GPU, TP and flags: the bench's report header."""
    from servefleet.gateway.replica import Replica

    gw = parse_config(
        {
            "replicas": [
                {"url": "http://127.0.0.1:9", "model": "Qwen1.5-14B", "gpu": "V100-SXM2-32G",
                 "tp": 2, "max_num_seqs": 256, "max_num_batched_tokens": 2048}
            ]
        },
        "t",
    )  # fmt: skip
    d = Replica(gw.replicas[0], gw).describe()
    assert (d["model"], d["gpu"], d["tp"], d["max_num_seqs"], d["max_num_batched_tokens"]) == (
        "Qwen1.5-14B",
        "V100-SXM2-32G",
        2,
        256,
        2048,
    )
