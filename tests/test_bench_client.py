"""The client and the runner against the exact-timing test server, over real loopback HTTP."""

from __future__ import annotations

import asyncio
import json

import pytest

from servefleet.bench.client import Client, Request
from servefleet.bench.point import Load, PointSettings
from servefleet.bench.runs import BenchConfig, run_bench
from servefleet.bench.schedule import StopRule
from servefleet.bench.testserver import spawn_test_server
from servefleet.records import RequestRecord
from servefleet.stats import error_kind
from servefleet.workload import fixed_workload, validate_workload


@pytest.fixture(scope="module")
def server():
    with spawn_test_server("--ttft", "0.02", "--itl", "0.002", "--chunks", "1,3,1,2") as s:
        yield s.url


def bench(url, workload, load, stop, **kw):
    cfg = BenchConfig(url, workload, PointSettings(stop), [load], **kw)
    return asyncio.run(run_bench(cfg))


def test_chat_stream_ttft_skips_role_chunk_and_counts_multi_token_chunks(server):
    run = bench(server, fixed_workload(40, 16), Load(concurrency=2), StopRule(max_requests=4))
    p = run.points[0]
    assert run.calibration.method == "server /tokenize" and run.target.model == "test-model"
    assert len(p.records) == 4 and all(r.ok for r in p.records)
    for r in p.records:
        assert r.chunk_tokens == [1, 3, 1, 2, 1, 3, 1, 2, 1, 1]  # the script, clipped to 16
        assert r.output_tokens == 16 and r.finish_reason == "length"
        assert 0.019 < r.ttft < 0.06  # the role-only chunk came at once, the text 20 ms later
        assert r.prompt_tokens == 40 and r.target_prompt_tokens == 40
        assert r.replica == "test-0"
    assert p.summary.itl.p50 == pytest.approx(0.002, abs=0.001)
    assert p.server is not None and p.server.prefix_hit_rate == pytest.approx(0.5)
    assert p.server.histograms["ttft"].count == 4


def test_tokens_per_chunk_from_final_usage_when_chunks_carry_none(server):
    run = bench(
        server,
        fixed_workload(10, 9),
        Load(concurrency=1),
        StopRule(max_requests=2),
        continuous_usage=False,
        endpoint="completions",
    )
    for r in run.points[0].records:
        assert r.ok and r.chunk_tokens == [1, 3, 1, 2, 1, 1] and r.output_tokens == 9


def test_sessions_resend_the_answers_actually_received(server):
    spec = validate_workload(
        {
            "name": "two-turns",
            "arrival": {"type": "poisson", "rate": 1},
            "classes": {
                "chat": {
                    "prompt": 10,
                    "output": 8,
                    "session": {"turns": 2, "think_time_mean": 0.01},
                }
            },
        }
    )
    run = bench(server, spec, Load(concurrency=1), StopRule(max_requests=2))
    first, second = sorted(run.points[0].records, key=lambda r: r.turn)
    assert first.session_id == second.session_id and second.turn == 1
    assert first.prompt_tokens == 10
    assert second.prompt_tokens == 10 + 8 + 10  # history: message, the 8 words received, message


def test_open_loop_keeps_to_the_absolute_schedule(server):
    run = bench(server, fixed_workload(10, 4), Load(rate=40.0), StopRule(duration=1.5))
    p = run.points[0]
    assert 40 <= len(p.records) <= 85
    lags = [r.send_time - r.scheduled_time for r in p.records]
    assert sorted(lags)[len(lags) * 9 // 10] < 0.02 and p.selfcheck.send_lag_p50 < 0.005
    assert p.selfcheck.offered_rate == pytest.approx(p.selfcheck.achieved_rate, rel=0.1)


async def _send(url: str, fault: str | None, path="/v1/chat/completions") -> RequestRecord:
    c = Client(timeout=10)
    await c.start()
    try:
        headers = c.base_headers() | ({"X-Test-Fault": fault} if fault else {})
        body = json.dumps(
            {
                "model": "m",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 8,
                "stream": True,
            }
        ).encode()
        rec = RequestRecord("x", "c", 0.0, 0.0)
        out = await c.send(Request(url + path, body, headers, rec, chat=True))
        return out.record
    finally:
        await c.stop()


@pytest.mark.parametrize(
    ("fault", "kind", "text"),
    [
        ("http-429", "HTTP 429", "injected fault 429"),
        ("http-500", "HTTP 500", "injected fault 500"),
        ("stream-error", "stream", "injected stream error"),
        ("drop", "disconnected", "closed"),
    ],
)
def test_failures_become_records_with_a_kind(server, fault, kind, text):
    r = asyncio.run(_send(server, fault))
    assert not r.ok and error_kind(r) == kind and text in r.error and r.end_time is not None


def test_unreachable_server_is_a_connect_error():
    r = asyncio.run(_send("http://127.0.0.1:9", None))
    assert not r.ok and error_kind(r) == "connect" and "cannot reach" in r.error


def test_slo_search_runs_points_until_the_bracket_closes(server, tmp_path):
    from servefleet.bench.search import SloSearch
    from servefleet.report.run import load_run
    from servefleet.stats import SLO

    search = SloSearch(start=4.0, max_points=3)
    cfg = BenchConfig(
        server,
        fixed_workload(10, 4),
        PointSettings(StopRule(duration=0.6), slo=SLO(ttft=1.0, itl=0.5)),
        search=search,
        out=tmp_path / "run",
    )
    run = asyncio.run(run_bench(cfg))
    assert [p.load.rate for p in run.points] == [4.0, 8.0, 16.0]
    assert search.steps == [(4.0, True), (8.0, True), (16.0, True)] and search.result == 16.0
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert saved["search"]["highest_rate_held"] == 16.0
    assert [p.rate for p in load_run(tmp_path / "run").points] == [4.0, 8.0, 16.0]


def test_a_stream_far_behind_its_plan_is_written_without_recursion():
    """Every chunk due at once (``--fast``) with 1-token chunks: 3,000 writes in one go."""
    with spawn_test_server("--fast", "--chunks", "1") as s:
        run = bench(s.url, fixed_workload(10, 3000), Load(concurrency=1), StopRule(max_requests=1))
    (r,) = run.points[0].records
    assert r.ok and r.output_tokens == 3000 and len(r.chunk_tokens) == 3000


def test_default_protocol_asks_for_usage_in_the_last_chunk_only():
    """The bench streams as the OpenAI SDK does unless told otherwise: per-chunk usage costs
    vLLM's API server work on every token, so it is asked for only with --usage-per-chunk."""
    from servefleet.bench.prompts import PromptRenderer
    from servefleet.bench.requests import Target, build_request
    from servefleet.workload.types import RequestSpec, Segment

    spec = RequestSpec("r1", "default", (Segment("u:r1", 8),), 4, 0.0)
    r = PromptRenderer(1.0, 1)
    plain = json.loads(build_request(spec, Target("http://x", "m"), r, {}).body)
    assert plain["stream_options"] == {"include_usage": True}
    per_chunk = Target("http://x", "m", continuous_usage=True)
    body = json.loads(build_request(spec, per_chunk, r, {}).body)
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}


def test_tokens_per_chunk_from_token_ids_without_any_usage(server):
    """No usage at all (the SDK's bare stream): each chunk's ``token_ids`` count its tokens;
    without them every text chunk would count one."""
    from servefleet.bench.prompts import PromptRenderer
    from servefleet.bench.requests import Target, build_request
    from servefleet.workload.types import RequestSpec, Segment

    async def go(extra):
        c = Client()
        await c.start()
        try:
            t = Target(server, "test-model", "completions", extra_body=extra)
            spec = RequestSpec("r2", "default", (Segment("u:r2", 10),), 9, 0.0)
            return (await c.send(build_request(spec, t, PromptRenderer(1.0, 1), {}))).record
        finally:
            await c.stop()

    with_ids = asyncio.run(go((("stream_options", {}), ("return_token_ids", True))))
    assert with_ids.ok and with_ids.chunk_tokens == [1, 3, 1, 2, 1, 1]
    assert with_ids.output_tokens == 9
    bare = asyncio.run(go((("stream_options", {}),)))
    assert bare.ok and bare.chunk_tokens == [1] * 6 and bare.output_tokens == 6


def test_send_and_read_times_are_taken_at_the_socket(server):
    """The send time comes from aiohttp's public trace signal; read times from a subclass of
    its private ``ResponseHandler`` (no public signal marks each socket read). This fails when
    an aiohttp release breaks either: keep pyproject's aiohttp range to releases it passes on."""
    import time
    import urllib.request

    import aiohttp

    from servefleet.bench.client import TimedResponseHandler, read_times_hooked

    body = json.dumps({"model": "m", "prompt": "hi", "max_tokens": 12, "stream": True}).encode()

    async def go() -> tuple[RequestRecord, float, float, list, list]:
        c = Client(timeout=10)
        await c.start()
        assert c.session is not None
        try:
            assert read_times_hooked(c.session.connector), (
                f"aiohttp {aiohttp.__version__} no longer takes the bench's ResponseHandler "
                "subclass: read times would fall back to parse times"
            )
            headers = c.base_headers() | {"X-Request-Id": "timed"}
            before = time.perf_counter()
            rec = RequestRecord("timed", "c", 0.0, 0.0)
            await c.send(Request(server + "/v1/completions", body, headers, rec, chat=False))
            # the same stream read by hand: the protocol's marks against the reading task's
            by_hand = headers | {"X-Request-Id": "by-hand"}
            async with c.session.post(server + "/v1/completions", data=body, headers=by_hand) as r:
                proto = r.connection.protocol if r.connection is not None else None
                assert isinstance(proto, TimedResponseHandler)
                got, n = [], 0
                async for data in r.content.iter_any():
                    n += len(data)
                    got.append((time.perf_counter(), n))
                marks = list(proto.marks)
            return rec, c.t0, before, got, marks
        finally:
            await c.stop()

    urllib.request.urlopen(urllib.request.Request(server + "/truth/reset", method="POST"))
    rec, t0, before, got, marks = asyncio.run(go())
    truth = json.loads(urllib.request.urlopen(server + "/truth", timeout=10).read())["timed"]
    assert rec.ok and len(rec.chunk_times) == len(truth["chunks"])
    # each chunk read no earlier than the server wrote it
    assert all(t + t0 >= w for t, (w, _) in zip(rec.chunk_times, truth["chunks"], strict=True))
    # sent after send() began, before the server had the whole request (one clock)
    assert before <= rec.send_time + t0 <= truth["recv"]
    # every read the task saw was marked at or before it, with the payload bytes so far
    assert marks and marks[-1][1] == got[-1][1]
    for t, n in got:
        assert any(mt <= t and mn >= n for mt, mn in marks)
    assert [mn for _, mn in marks] == sorted(mn for _, mn in marks)
