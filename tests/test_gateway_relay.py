"""The streaming relay's fast path, in one process: fake replicas (aiohttp apps) in front of
which a ``Gateway`` runs on loopback; plus the small parts that keep the request path cheap."""

from __future__ import annotations

import asyncio
import json

import aiohttp
from aiohttp import web

from servefleet.gateway.app import Gateway
from servefleet.gateway.config import parse_config
from servefleet.gateway.metrics import GatewayMetrics
from servefleet.gateway.replica import HEALTHY

EVENT = b'data: {"choices":[{"index":0,"text":"hi ","finish_reason":null}]}\n\n'


def test_metric_children_are_cached_and_forgotten_with_their_replica():
    m = GatewayMetrics()
    c = m.requests_of("completions", "200", "a", "load")
    assert m.requests_of("completions", "200", "a", "load") is c
    c.inc()
    assert b'status="200"' in m.render()
    m.routed_prompt_tokens_of("a").inc(5)
    m.forget_replica("a")
    assert not m.routed_prompt_tokens_of.cache and not m.requests_of.cache


class FakeReplica:
    """/health, /v1/models and a /v1/completions whose stream is driven by the test."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.calls = 0
        self.release = asyncio.Event()
        self.url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/health", self.json)
        app.router.add_get("/v1/models", self.json)
        app.router.add_post("/v1/completions", self.completions)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    @staticmethod
    async def json(request: web.Request) -> web.Response:
        return web.json_response({"data": []})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        self.calls += 1
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"")  # the headers, now
        if self.mode == "die":  # 200 and headers, then the connection is cut
            assert request.transport is not None
            request.transport.close()
            return resp
        await self.release.wait()
        await resp.write(EVENT)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


async def _gateway(replicas: list[FakeReplica]) -> tuple[web.AppRunner, str]:
    cfg = parse_config(
        {
            "replicas": [{"url": r.url} for r in replicas],
            "health": {"interval": 60.0},
            "retry": {"max_attempts": 2, "backoff_base": 0.0, "backoff_max": 0.0},
        }
    )
    gw = Gateway(cfg)
    runner = web.AppRunner(gw.build_app(), handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    for rep in gw.replicas:
        rep.health = HEALTHY  # as if its checks had passed
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


BODY = {"model": "m", "prompt": "x", "max_tokens": 4, "stream": True}


def test_stream_headers_go_out_before_the_first_token():
    async def main() -> None:
        rep = FakeReplica("hold")
        await rep.start()
        runner, url = await _gateway([rep])
        try:
            async with (
                aiohttp.ClientSession() as s,
                s.post(url + "/v1/completions", json=BODY) as r,
            ):
                # the replica holds its first event until told: the headers came first
                assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
                assert r.headers["X-Servefleet-Replica"] == rep.url.split("//")[1]
                rep.release.set()
                body = await r.read()
            assert body == EVENT + b"data: [DONE]\n\n"
        finally:
            await runner.cleanup()
            await rep.runner.cleanup()

    asyncio.run(asyncio.wait_for(main(), 30))  # headers held back: a timeout, not a hang


def test_replicas_that_die_after_their_headers_end_the_stream_with_an_error_event():
    async def main() -> None:
        reps = [FakeReplica("die"), FakeReplica("die")]
        for r in reps:
            await r.start()
        runner, url = await _gateway(reps)
        try:
            async with (
                aiohttp.ClientSession() as s,
                s.post(url + "/v1/completions", json=BODY) as r,
            ):
                assert r.status == 200
                body = await r.read()
            events = [e for e in body.split(b"\n\n") if e]
            assert events[-1] == b"data: [DONE]"
            err = json.loads(events[0][len(b"data: ") :])["error"]
            # the same failure on two replicas: the request's own, tried on no third
            assert "same way on two replicas" in err["message"]
            assert [r.calls for r in reps] == [1, 1]  # retried before any event
        finally:
            await runner.cleanup()
            for r in reps:
                await r.runner.cleanup()

    asyncio.run(asyncio.wait_for(main(), 30))
