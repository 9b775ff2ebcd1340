"""Failures with real sim-server processes: a replica killed mid-stream, 5xx answers, a
replica that never becomes ready, a client that goes away."""

from __future__ import annotations

import asyncio
import functools
import json
import time

import aiohttp
import pytest

from test_gateway_support import (
    MODEL,
    client_ssl,
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


async def stream(
    url: str, route: str, body: dict, headers: dict | None = None, out: dict | None = None
) -> dict:
    """One streamed request: the text of choice 0, the events, the usage, any error event
    (``out`` is filled as the stream goes, for a watcher)."""
    out = out if out is not None else {}
    out.update({"text": "", "events": 0, "usage": None, "error": None, "done": False, "roles": 0})
    async with (
        aiohttp.ClientSession() as s,
        s.post(url + route, json={**body, "stream": True}, headers=headers or {}) as r,
    ):
        out["status"] = r.status
        out["replica"] = r.headers.get("X-Servefleet-Replica")
        out["events"] = 0
        async for line in r.content:
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            if line == b"data: [DONE]":
                out["done"] = True
                continue
            ev = json.loads(line[6:])
            out["events"] += 1
            if "error" in ev:
                out["error"] = ev["error"]
                continue
            if ev.get("usage") and not ev.get("choices"):
                out["usage"] = ev["usage"]
            for c in ev.get("choices", []):
                if "delta" in c:
                    out["roles"] += "role" in c["delta"]
                    out["text"] += c["delta"].get("content") or ""
                else:
                    out["text"] += c.get("text") or ""
    return out


def completion_text(url: str, prompt: str, max_tokens: int) -> str:
    status, _, body = http(
        "POST",
        url + "/v1/completions",
        {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True},
    )
    assert status == 200, body
    return body["choices"][0]["text"]


def chat_text(url: str, messages: list[dict], max_tokens: int, **extra) -> str:
    status, _, body = http(
        "POST",
        url + "/v1/chat/completions",
        {"model": MODEL, "messages": messages, "max_tokens": max_tokens, **extra},
    )
    assert status == 200, body
    return body["choices"][0]["message"]["content"]


def split_point(got: list[str], ref: list[str]) -> int:
    k = 0
    while k < min(len(got), len(ref)) and got[k] == ref[k]:
        k += 1
    return k


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
def test_replica_killed_mid_stream_is_ejected_and_its_streams_finish_elsewhere(tls):
    """The one request path, over plain and TLS connections alike."""
    n_tokens = 200
    healthy = [sim_server(tls=tls), sim_server(tls=tls)]
    doomed = sim_server(time_scale=1.0, tls=tls)  # slow: its streams are under way when it dies
    with procs(*healthy, doomed):
        gw = gateway("--policy", "round-robin", replicas=[doomed, *healthy])
        with procs(gw):
            wait_ready(gw, 3)
            prompts = [f"tell me story number {i} about the sea and the sky" for i in range(6)]
            chats = [
                [{"role": "user", "content": f"question {i}: why is the sky blue"}]
                for i in range(6)
            ]
            progress = [{} for _ in range(12)]
            doomed_name = doomed.url.split("//")[1]

            async def kill_when_under_way():
                def under_way():
                    mine = [p for p in progress if p.get("replica") == doomed_name]
                    return len(mine) == 4 and all(p["events"] >= 3 for p in mine)

                while not under_way():
                    await asyncio.sleep(0.01)
                async with aiohttp.ClientSession() as s:
                    # the process exits at its next token: connections cut, no clean shutdown
                    await s.post(doomed.url + "/admin/faults", json={"exit_after_tokens": 1},
                                 headers={"Authorization": "Bearer sim-admin"},
                                 ssl=client_ssl(doomed.url))  # fmt: skip

            async def run_all():
                c = [
                    stream(gw.url, "/v1/completions", {"model": MODEL, "prompt": p, "max_tokens": n_tokens,
                           "ignore_eos": True, "stream_options": {"include_usage": True}}, out=progress[i])
                    for i, p in enumerate(prompts)
                ]  # fmt: skip
                h = [
                    stream(gw.url, "/v1/chat/completions", {"model": MODEL, "messages": m, "max_tokens": n_tokens,
                           "ignore_eos": True}, out=progress[6 + i])
                    for i, m in enumerate(chats)
                ]  # fmt: skip
                return await asyncio.wait_for(asyncio.gather(*c, *h, kill_when_under_way()), 60)

            results = asyncio.run(run_all())[:12]
            wait_for(lambda: not doomed.alive(), 10, "the doomed replica to exit")
            ref_url = healthy[0].url
            resumed = 0
            for i, r in enumerate(results):
                assert r["status"] == 200 and r["done"] and r["error"] is None, r
                words = r["text"].split()
                assert len(words) == n_tokens, (i, r["text"])  # no lost or repeated token
                if i < 6:
                    ref = completion_text(ref_url, prompts[i], n_tokens).split()
                else:
                    ref = chat_text(ref_url, chats[i - 6], n_tokens, ignore_eos=True).split()
                k = split_point(words, ref)
                assert (k < n_tokens) == (r["replica"] == doomed_name), (i, k, r["replica"])
                if k == n_tokens:
                    continue
                resumed += 1
                assert k >= 3
                # the rest is exactly what a replica continues from the text already sent
                if i < 6:
                    cont = completion_text(
                        ref_url, prompts[i] + " " + " ".join(words[:k]), n_tokens - k
                    )
                    assert r["usage"]["completion_tokens"] == n_tokens
                    assert r["usage"]["prompt_tokens"] == len(prompts[i].split())
                else:
                    partial = {"role": "assistant", "content": " ".join(words[:k])}
                    cont = chat_text(ref_url, [*chats[i - 6], partial], n_tokens - k, ignore_eos=True,
                                     continue_final_message=True, add_generation_prompt=False)  # fmt: skip
                    assert r["roles"] == 1  # one role chunk, as from one replica
                assert cont.split() == words[k:]
            assert resumed == 4  # round-robin sent 4 of the 12 streams to the doomed replica
            wait_for(lambda: states(gw)[doomed.url] in ("unhealthy", "ejected"), 10, "ejection")
            m = metrics(gw)
            assert metric(m, "servefleet_gateway_resumptions_total", outcome="resumed") == 4
            assert metric(m, "servefleet_gateway_ejections_total") >= 1
            # traffic now avoids the dead replica
            for _ in range(6):
                status, h, _ = http(
                    "POST",
                    gw.url + "/v1/completions",
                    {"model": MODEL, "prompt": "hi", "max_tokens": 2},
                )
                assert status == 200 and h["X-Servefleet-Replica"] != doomed_name


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
def test_5xx_before_first_byte_is_retried_and_the_breaker_opens(tls):
    good = sim_server(tls=tls)
    bad = sim_server("--fault-fail-fraction", "1.0", tls=tls)
    with procs(good, bad):
        gw = gateway(
            "--policy", "round-robin", "--set", "breaker.consecutive_failures=3",
            "--set", "breaker.base_ejection=30", replicas=[bad, good],
        )  # fmt: skip
        with procs(gw):
            wait_ready(gw, 2)
            for i in range(12):
                body = {"model": MODEL, "prompt": f"p {i}", "max_tokens": 3, "stream": i % 2 == 0}
                status, h, _ = http("POST", gw.url + "/v1/completions", body)
                assert status == 200
                assert h["X-Servefleet-Replica"] == good.url.split("//")[1]
            assert states(gw)[bad.url] == "ejected"
            m = metrics(gw)
            assert metric(m, "servefleet_gateway_retries_total") >= 3
            assert metric(m, "servefleet_gateway_ejections_total", source="breaker") == 1
            assert (
                metric(m, "servefleet_gateway_breaker_state", replica=bad.url.split("//")[1]) == 2
            )


def test_replicas_not_ready_get_no_traffic_until_ready():
    ready = sim_server()
    loading = sim_server(startup=6.0)
    with procs(ready, loading):
        gw = gateway("--policy", "round-robin", replicas=[ready, loading])
        with procs(gw):
            wait_ready(gw, 1)
            assert states(gw)[loading.url] == "starting"
            for i in range(10):
                status, h, _ = http(
                    "POST",
                    gw.url + "/v1/completions",
                    {"model": MODEL, "prompt": f"x {i}", "max_tokens": 2},
                )
                assert status == 200 and h["X-Servefleet-Replica"] == ready.url.split("//")[1]
            status, _, body = http("GET", loading.url + "/metrics")
            assert metric(body, "vllm:request_success_total") == 0
            wait_ready(gw, 2, timeout=15)  # its /health turns 200 after the start-up time
            seen = set()
            for i in range(4):
                _, h, _ = http(
                    "POST",
                    gw.url + "/v1/completions",
                    {"model": MODEL, "prompt": f"y {i}", "max_tokens": 2},
                )
                seen.add(h["X-Servefleet-Replica"])
            assert len(seen) == 2


def test_client_disconnect_cancels_the_upstream_request():
    rep = sim_server(time_scale=1.0)
    with procs(rep):
        gw = gateway(replicas=[rep])
        with procs(gw):
            wait_ready(gw, 1)

            async def go():
                async with aiohttp.ClientSession() as s:
                    r = await s.post(gw.url + "/v1/completions", json={"model": MODEL, "prompt": "long one", "max_tokens": 3000,
                                                                       "ignore_eos": True, "stream": True})  # fmt: skip
                    await r.content.readline()
                    running = metric(
                        http("GET", rep.url + "/metrics")[2], "vllm:num_requests_running"
                    )
                    r.close()
                    return running

            assert asyncio.run(go()) == 1
            wait_for(lambda: metric(http("GET", rep.url + "/metrics")[2], "vllm:num_requests_running") == 0, 5,
                     "the replica to abort the request")  # fmt: skip
            wait_for(
                lambda: metric(metrics(gw), "servefleet_gateway_client_disconnects_total") == 1,
                5,
                "the count",
            )


def test_a_stalled_replica_is_timed_out_and_the_stream_resumed_or_ended_with_an_error():
    reps = [sim_server(time_scale=1.0), sim_server(time_scale=1.0)]
    admin = {"Authorization": "Bearer sim-admin"}
    with procs(*reps):
        gw = gateway("--set", "stream.idle_timeout=0.5", replicas=reps)
        with procs(gw):
            wait_ready(gw, 2)
            url_of = {p.url.split("//")[1]: p.url for p in reps}

            def stall_over(url: str) -> bool:
                return (
                    http("GET", url + "/admin/faults", headers=admin)[2]["stall_remaining_seconds"]
                    == 0
                )

            async def go(body: dict) -> dict:
                progress: dict = {}

                async def stall_when_under_way():
                    while progress.get("events", 0) < 3:
                        await asyncio.sleep(0.01)
                    async with aiohttp.ClientSession() as s:  # the replica serving it hangs
                        await s.post(url_of[progress["replica"]] + "/admin/faults",
                                     json={"stall_seconds": 1.5}, headers=admin)  # fmt: skip

                r, _ = await asyncio.wait_for(
                    asyncio.gather(
                        stream(gw.url, "/v1/completions", body, out=progress),
                        stall_when_under_way(),
                    ),
                    20,
                )
                return r

            base = {"model": MODEL, "prompt": "a story", "max_tokens": 80, "ignore_eos": True}
            r = asyncio.run(go(base))
            assert r["done"] and r["error"] is None and len(r["text"].split()) == 80
            assert not stall_over(url_of[r["replica"]])  # it finished elsewhere, during the stall
            wait_for(lambda: stall_over(url_of[r["replica"]]), 10, "the stall to end")
            wait_for(lambda: states(gw)[url_of[r["replica"]]] == "ready", 10, "the replica back")
            # two choices cannot be resumed: the stream ends with an error event, then [DONE]
            r = asyncio.run(go({**base, "n": 2}))
            assert r["done"] and r["error"]["code"] == "upstream_failed_mid_stream"
            m = metrics(gw)
            assert metric(m, "servefleet_gateway_resumptions_total", outcome="resumed") == 1
            assert metric(m, "servefleet_gateway_resumptions_total", outcome="error") == 1
            wait_for(lambda: stall_over(url_of[r["replica"]]), 10, "the stall to end")


def assert_exact(ref_url: str, prompt: str, words: list[str], n: int) -> int:
    """``words`` are what the replicas would have written had none failed: each part after a
    resumption is exactly the continuation of the prompt and the text before it (the
    sim-server's text is a function of its prompt). Returns the number of resumptions seen.

    A part may begin with the word the part before it would have written next (a 1-in-4,096
    chance): each split is tried from the longest match down, as far as 3 resumptions."""
    refs: dict[int, list[str]] = {}

    def ref(k0: int) -> list[str]:
        if k0 not in refs:
            before = " ".join(words[:k0])
            text = completion_text(ref_url, f"{prompt} {before}" if k0 else prompt, n - k0)
            refs[k0] = text.split()
        return refs[k0]

    @functools.cache
    def parts_from(k0: int, depth: int) -> int | None:
        if k0 == n:
            return 0
        if depth > 3:
            return None
        for k in range(split_point(words[k0:], ref(k0)), 0, -1):
            rest = parts_from(k0 + k, depth + 1)
            if rest is not None:
                return rest + (k0 + k < n)
        return None

    parts = parts_from(0, 0)
    assert parts is not None, (words, {k: r[:5] for k, r in refs.items()})
    return parts


@pytest.mark.parametrize("together", [False, True], ids=["one_then_another", "two_at_once"])
def test_streams_finish_exactly_while_two_of_three_replicas_die(together):
    """Resumptions go to every live replica in turn: a dead one refuses the connection, is
    marked down for every stream at once, and costs no resumption."""
    n_tokens = 160
    reps = [sim_server(time_scale=1.0) for _ in range(3)]
    with procs(*reps):
        gw = gateway("--policy", "round-robin", replicas=reps)
        with procs(gw):
            wait_ready(gw, 3)
            prompts = [f"story {i} about a lighthouse keeper" for i in range(9)]
            progress = [{} for _ in prompts]
            name = {p.url.split("//")[1]: p for p in reps}

            async def kill_under_way():
                while not all(p.get("events", 0) >= 3 for p in progress):
                    await asyncio.sleep(0.01)
                first = name[progress[0]["replica"]]
                second = next(p for p in reps if p is not first)
                first.p.kill()
                if not together:  # the second dies once the first one's streams moved on
                    while not all(p.get("events", 0) >= 40 or p.get("done") for p in progress):
                        await asyncio.sleep(0.01)
                second.p.kill()
                return {first.url, second.url}

            async def run_all():
                body = {"model": MODEL, "max_tokens": n_tokens, "ignore_eos": True,
                        "stream_options": {"include_usage": True}}  # fmt: skip
                tasks = [
                    stream(gw.url, "/v1/completions", {**body, "prompt": p}, out=progress[i])
                    for i, p in enumerate(prompts)
                ]
                return await asyncio.wait_for(asyncio.gather(*tasks, kill_under_way()), 90)

            *results, dead = asyncio.run(run_all())
            live = next(p for p in reps if p.url not in dead)
            resumed = 0
            for i, r in enumerate(results):
                assert r["status"] == 200 and r["done"] and r["error"] is None, r
                words = r["text"].split()
                assert len(words) == n_tokens, (i, r["text"])  # no lost or repeated token
                assert r["usage"]["completion_tokens"] == n_tokens
                resumed += assert_exact(live.url, prompts[i], words, n_tokens)
            assert resumed >= 6  # the streams of both dead replicas moved on
            m = metrics(gw)
            assert metric(m, "servefleet_gateway_resumptions_total", outcome="error") == 0
            assert metric(m, "servefleet_gateway_resumptions_total", outcome="resumed") == resumed


def test_streams_end_with_an_error_event_at_once_when_every_replica_dies():
    reps = [sim_server(time_scale=1.0) for _ in range(3)]
    with procs(*reps):
        gw = gateway("--policy", "round-robin", replicas=reps)
        with procs(gw):
            wait_ready(gw, 3)
            progress = [{} for _ in range(6)]
            ended: list[float] = []
            killed: list[float] = []

            async def one(i: int) -> dict:
                body = {"model": MODEL, "prompt": f"tale {i}", "max_tokens": 500,
                        "ignore_eos": True}  # fmt: skip
                r = await stream(gw.url, "/v1/completions", body, out=progress[i])
                ended.append(time.monotonic())
                return r

            async def kill_all():
                while not all(p.get("events", 0) >= 3 for p in progress):
                    await asyncio.sleep(0.01)
                killed.append(time.monotonic())
                for p in reps:
                    p.p.kill()

            async def run_all():
                tasks = [one(i) for i in range(6)]
                return await asyncio.wait_for(asyncio.gather(*tasks, kill_all()), 60)

            results = asyncio.run(run_all())[:6]
            for r in results:
                assert r["done"] and r["error"]["code"] == "upstream_failed_mid_stream", r
            assert max(ended) - killed[0] < 1.0, max(ended) - killed[0]


def test_a_replica_hung_before_answering_gets_no_request_after_its_first_token_deadline():
    """Its /health still answers; the first stream sent to it waits past its first-token
    deadline with no event from it to any stream: it is ejected, and that stream and a
    non-streamed request sent there too are retried on the other replica."""
    hung, good = sim_server(), sim_server()
    with procs(hung, good):
        gw = gateway("--policy", "round-robin", "--set", "stream.min_first_token=0.5",
                     "--set", "breaker.base_ejection=60", replicas=[hung, good])  # fmt: skip
        with procs(gw):
            wait_ready(gw, 2)
            for i in range(4):  # both replicas serve a while: their times to first token learned
                body = {"model": MODEL, "prompt": f"warm {i}", "max_tokens": 2, "stream": True}
                assert http("POST", gw.url + "/v1/completions", body)[0] == 200
            assert all(r["ttft_s"] > 0 for r in fleet(gw)["replicas"])
            status, _, _ = http("POST", hung.url + "/admin/faults", {"stall_seconds": 60},
                                headers={"Authorization": "Bearer sim-admin"})  # fmt: skip
            assert status == 200
            hung_name = hung.url.split("//")[1]

            async def run_all():
                body = {"model": MODEL, "prompt": "hello there", "max_tokens": 20,
                        "ignore_eos": True}  # fmt: skip

                async def plain() -> dict:
                    async with (
                        aiohttp.ClientSession() as s,
                        s.post(gw.url + "/v1/completions", json=body) as r,
                    ):
                        return {"status": r.status, **(await r.json())}

                t0 = time.monotonic()
                out = await asyncio.wait_for(
                    asyncio.gather(
                        stream(gw.url, "/v1/completions", body),
                        stream(gw.url, "/v1/completions", body),
                        plain(),
                        plain(),
                    ),
                    20,
                )
                return out, time.monotonic() - t0

            (s1, s2, p1, p2), took = asyncio.run(run_all())
            for r in (s1, s2):
                assert r["done"] and r["error"] is None and len(r["text"].split()) == 20, r
            for r in (p1, p2):
                assert r["status"] == 200 and len(r["choices"][0]["text"].split()) == 20, r
            assert took < 10  # not the stall's 60 s, nor idle_timeout's
            assert states(gw)[hung.url] == "ejected"
            m = metrics(gw)
            assert metric(m, "servefleet_gateway_ejections_total", source="first_token") == 1
            sent = next(r["requests"] for r in fleet(gw)["replicas"] if r["name"] == hung_name)
            for i in range(6):
                body = {"model": MODEL, "prompt": f"q {i}", "max_tokens": 3, "stream": i % 2 == 0}
                status, h, _ = http("POST", gw.url + "/v1/completions", body)
                assert status == 200 and h["X-Servefleet-Replica"] != hung_name
            now = next(r["requests"] for r in fleet(gw)["replicas"] if r["name"] == hung_name)
            assert now == sent
