"""`servefleet bench` through a servefleet gateway: the server-side (vLLM) figures come from
the replicas' own /metrics, combined, since the gateway's /metrics has none of them.

Real processes: two sim-servers behind a real gateway, each waited on by its ready line and
the gateway's /fleet, never by sleeping."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from servefleet.bench.scrape import (
    ClientTokens,
    Scrape,
    Scraper,
    combine,
    parse_metrics,
    server_delta,
)
from servefleet.records import read_jsonl
from test_gateway_support import fleet, gateway, procs, sim_server, wait_for, wait_ready

ENV = {**os.environ, "COLUMNS": "200"}


WORKLOAD = """
arrival: {type: poisson, rate: 10}
classes:
  chat:
    prompt: 40
    output: 6
    system_prompt: {tokens: 128, share: 1.0, groups: 1}
"""


def bench(url: str, out: Path, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """One point of 24 requests, 4 at a time, every prompt behind one shared system prompt."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "wl.yaml").write_text(WORKLOAD)
    args = [
        sys.executable, "-m", "servefleet.bench", "bench", "--url", url,
        "--workload", str(out / "wl.yaml"), "--concurrency", "4",
        "--requests", "24", "--duration", "0", "--out", str(out / "run"), *extra,
    ]  # fmt: skip
    return subprocess.run(args, capture_output=True, text=True, timeout=60, env=env or ENV)


@pytest.fixture(scope="module")
def fleet_gw():
    servers = [sim_server(time_scale=20.0) for _ in range(2)]
    with procs(*servers):
        gw = gateway("--policy", "round-robin", replicas=servers)
        with procs(gw):
            wait_ready(gw, 2)
            yield gw, servers


def test_bench_through_the_gateway_sums_the_replicas_metrics(fleet_gw, tmp_path: Path):
    gw, servers = fleet_gw
    p = bench(gw.url, tmp_path)
    assert p.returncode == 0, p.stderr
    metrics_urls = sorted(s.url + "/metrics" for s in servers)
    assert "summed over 2 replicas behind the gateway" in p.stderr
    assert all(u in p.stderr for u in metrics_urls)
    point = json.loads((tmp_path / "run" / "summary.json").read_text())["points"][0]
    v = point["server"]
    assert sorted(v["scraped"]) == metrics_urls and v["notes"] == []
    reps = v["replicas"]
    assert sorted(reps) == metrics_urls

    # what the client saw, per replica (the gateway names it in X-Servefleet-Replica)
    recs = list(read_jsonl(tmp_path / "run" / "records-c4.jsonl.gz"))
    assert len(recs) == 24 and all(r.ok for r in recs)
    url_of = {r["name"]: r["url"] + "/metrics" for r in fleet(gw)["replicas"]}
    sent = Counter(url_of[r.replica] for r in recs)
    prompt = defaultdict(int)
    for r in recs:
        prompt[url_of[r.replica]] += r.prompt_tokens
    assert all(sent[u] > 0 for u in metrics_urls)  # both replicas served

    # each replica's own figures match the requests the client sent it ...
    for u in metrics_urls:
        assert reps[u]["requests"] == sent[u]
        assert reps[u]["prompt_tokens"] == prompt[u]
        assert reps[u]["generation_tokens"] == 6 * sent[u]
    # ... and the point's server view is their sum (counters, histograms), max (KV)
    h = v["histograms"]
    assert h["e2e"]["count"] == h["ttft"]["count"] == len(recs)
    for key in ("prompt_tokens", "generation_tokens", "prefix_queries", "prefix_hits"):
        assert v[key] == sum(reps[u][key] for u in metrics_urls)
        assert all(reps[u][key] > 0 for u in metrics_urls)  # the system prompt hits the cache
    assert v["prompt_tokens"] == sum(r.prompt_tokens for r in recs)
    assert v["prefix_queries"] > 0 and v["prefix_hit_rate"] == pytest.approx(
        v["prefix_hits"] / v["prefix_queries"]
    )
    assert v["peak_kv_usage"] == max(reps[u]["peak_kv_usage"] for u in metrics_urls)
    assert v["preemptions"] == 0 and v["reprefill"] == 0
    assert h["ttft"]["mean"] > 0 and h["queue"]["count"] == len(recs)
    # the report shows the server columns filled in
    assert "server /metrics" in p.stdout


def test_no_scrape_replicas_reads_the_gateway_as_before(fleet_gw, tmp_path: Path):
    gw, _ = fleet_gw
    p = bench(gw.url, tmp_path, "--no-scrape-replicas")
    assert p.returncode == 0, p.stderr
    v = json.loads((tmp_path / "run" / "summary.json").read_text())["points"][0]["server"]
    assert v["scraped"] == [gw.url + "/metrics"] and v["replicas"] is None
    assert v["histograms"] == {} and v["preemptions"] is None and v["prompt_tokens"] is None
    assert "replicas behind the gateway" not in p.stderr


def _beyond_loopback() -> tuple[str, str]:
    """(address to bind a gateway to, address to reach it at): this machine's first
    non-loopback IPv4 address (``hostname -I``) when it has one, else 0.0.0.0 reached on
    127.0.0.1. Either way the gateway listens beyond loopback: what its guard keys on."""
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    for addr in out.split():
        if "." in addr and not addr.startswith("127."):
            with socket.socket() as s:
                try:
                    s.bind((addr, 0))
                except OSError:
                    continue
            return addr, addr
    return "0.0.0.0", "127.0.0.1"


def _ready_replicas(url: str) -> int:
    try:
        with urllib.request.urlopen(url + "/ready", timeout=2) as r:
            return len(json.loads(r.read())["ready_replicas"])
    except (OSError, ValueError):
        return 0


def test_bench_reads_a_gateway_beyond_loopback_with_its_admin_token(fleet_gw, tmp_path: Path):
    _, servers = fleet_gw
    bind, reach = _beyond_loopback()
    guarded = gateway("--host", bind, "--admin-token", "ops", replicas=servers)
    bare = gateway("--host", bind, replicas=servers)
    with procs(guarded, bare):
        urls = [f"http://{reach}:{gw.port}" for gw in (guarded, bare)]
        for u in urls:
            wait_for(lambda u=u: _ready_replicas(u) == 2, 20, f"{u}: 2 ready replicas")
        metrics_urls = sorted(s.url + "/metrics" for s in servers)

        # the token from the environment: /fleet read, the replicas' metrics summed
        p = bench(urls[0], tmp_path / "a", env={**ENV, "SERVEFLEET_ADMIN_TOKEN": "ops"})
        assert p.returncode == 0, p.stderr
        assert "summed over 2 replicas behind the gateway" in p.stderr
        s = json.loads((tmp_path / "a" / "run" / "summary.json").read_text())
        assert len(s["server_info"]["replicas"]) == 2 and s["server_note"] is None
        assert sorted(s["points"][0]["server"]["scraped"]) == metrics_urls

        # no token: one line that says what to pass; the run itself is whole
        p = bench(urls[0], tmp_path / "b")
        assert p.returncode == 0, p.stderr
        said = [ln for ln in p.stderr.splitlines() if "answered 401" in ln]
        assert len(said) == 1 and "--admin-token" in said[0] and urls[0] + "/fleet" in said[0]
        s = json.loads((tmp_path / "b" / "run" / "summary.json").read_text())
        point = s["points"][0]
        assert point["server"] is None and point["summary"]["num_ok"] == 24
        assert any("answered 401" in n for n in point["notes"])

        # a gateway beyond loopback without an admin token shows them to nobody: say so
        p = bench(urls[1], tmp_path / "c", "--admin-token", "ops")
        assert p.returncode == 0, p.stderr
        said = [ln for ln in p.stderr.splitlines() if "answered 403" in ln]
        assert len(said) == 1 and "start it with --admin-token" in said[0]


# -- pure parts ----------------------------------------------------------------------------
def _m(engine: str, queries: float, kv: float, ttft_le: str = "0.1") -> str:
    lab = f'engine="{engine}",model_name="m"'
    return (
        f"vllm:prefix_cache_queries_total{{{lab}}} {queries}\n"
        f"vllm:kv_cache_usage_perc{{{lab}}} {kv}\n"
        f"vllm:num_requests_running{{{lab}}} 3\n"
        f'vllm:time_to_first_token_seconds_bucket{{{lab},le="{ttft_le}"}} {queries / 100}\n'
        f'vllm:time_to_first_token_seconds_bucket{{{lab},le="+Inf"}} {queries / 100}\n'
        f"vllm:time_to_first_token_seconds_count{{{lab}}} {queries / 100}\n"
        f"vllm:time_to_first_token_seconds_sum{{{lab}}} {queries / 1000}\n"
    )


def test_engines_and_replicas_sum_counters_and_take_the_fullest_kv():
    one = parse_metrics(_m("0", 100, 0.2) + _m("1", 300, 0.7))
    assert one[("vllm:prefix_cache_queries_total", "")] == 400
    assert one[("vllm:kv_cache_usage_perc", "")] == 0.7  # a fraction: never summed
    assert one[("vllm:num_requests_running", "")] == 6
    # a replica writing the bound "0.10" shares the bucket of one writing "0.1"
    two = parse_metrics(_m("0", 1000, 0.5, ttft_le="0.10"))
    c = combine([one, two])
    assert c[("vllm:prefix_cache_queries_total", "")] == 1400
    assert c[("vllm:kv_cache_usage_perc", "")] == 0.7
    assert c[("vllm:time_to_first_token_seconds_bucket", "0.1")] == 14
    assert c[("vllm:time_to_first_token_seconds_bucket", "inf")] == 14


def test_only_replicas_scraped_before_and_after_count():
    a0, a1 = parse_metrics(_m("0", 100, 0.1)), parse_metrics(_m("0", 500, 0.3))
    b0, b1 = parse_metrics(_m("0", 40, 0.1)), parse_metrics(_m("0", 90, 0.9))
    c1 = parse_metrics(_m("0", 7, 0.2))
    before = Scrape({"a": a0, "b": b0}, replicas=True)
    after = Scrape({"a": a1, "b": b1, "c": c1}, replicas=True, notes=["d: GET /metrics failed"])
    v = server_delta(before, after, [], ClientTokens(10, 20))
    assert v.scraped == ["a", "b"] and v.prefix_queries == 400 + 50
    assert v.replicas["a"]["prefix_queries"] == 400 and v.replicas["b"]["peak_kv_usage"] == 0.9
    assert v.notes == ["d: GET /metrics failed", "c: scraped only after the point, left out"]
    # a replica that restarted during the point (its counters went backwards) is left out
    after = Scrape({"a": a1, "b": parse_metrics(_m("0", 5, 0.0))}, replicas=True)
    v = server_delta(before, after, [], ClientTokens(10, 20))
    assert v.scraped == ["a"] and v.prefix_queries == 400 and v.client_prompt_tokens is None
    assert "b: counters went backwards" in v.notes[0]


# -- the scraper against small fake targets --------------------------------------------------
async def _serve(
    routes: dict[str, Callable[[], web.Response]],
) -> tuple[web.AppRunner, str, Counter]:
    hits: Counter = Counter()
    app = web.Application()
    for path, resp in routes.items():

        async def h(request, resp=resp, path=path):
            hits[path] += 1
            return resp()

        app.router.add_get(path, h)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}", hits


def test_scraper_without_fleet_asks_once_then_scrapes_the_target():
    async def main():
        runner, url, hits = await _serve({"/metrics": lambda: web.Response(text=_m("0", 10, 0.5))})
        try:
            async with aiohttp.ClientSession() as s:
                sc = Scraper(url, s, interval=0.01)
                a = await sc.scrape()
                b = await sc.scrape()
        finally:
            await runner.cleanup()
        return a, b, hits, url

    a, b, hits, url = asyncio.run(main())
    assert a.parts.keys() == {url + "/metrics"} and not a.replicas and a == b
    assert hits["/metrics"] == 2  # /fleet (404) was asked once, then never again


def test_scraper_falls_back_to_the_gateway_when_no_replica_answers():
    async def main():
        dead = f"http://127.0.0.1:{_free_port()}"
        fleet_body = {"replicas": [{"name": "x", "url": dead, "state": "ready"}]}
        runner, url, hits = await _serve(
            {
                "/fleet": lambda: web.json_response(fleet_body),
                "/metrics": lambda: web.Response(text="servefleet_gateway_x 1\n"),
            }
        )
        try:
            async with aiohttp.ClientSession() as s:
                sc = Scraper(url, s)
                a = await sc.scrape()
                b = await sc.scrape()
        finally:
            await runner.cleanup()
        return a, b, sc, url, dead, hits

    a, b, sc, url, dead, hits = asyncio.run(main())
    assert list(a.parts) == list(b.parts) == [url + "/metrics"] and sc.fleet is False
    assert hits["/fleet"] == 1 and hits["/metrics"] == 2
    assert "no replica behind the gateway answered" in a.notes[0] and dead in a.notes[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
