"""How to send: one streamed OpenAI-compatible request, timed at every SSE event.

* aiohttp with keep-alive; ``reuse_connections=False`` opens a connection per request (it
  changes how a server batches, so it is a setting, not an accident).
* Timestamps are ``time.perf_counter()`` (monotonic, high resolution) taken where the bytes
  meet the socket. The send time: when aiohttp hands the request's body to the connection
  (its public ``TraceConfig.on_request_chunk_sent`` signal, in the same step as the write; the
  server can start no earlier; aiohttp's own request building is client overhead that shows up
  as send-schedule lag, not as TTFT). Each SSE event's time: in the ``data_received`` callback
  that brought its last byte, not when the reading task got around to it. aiohttp has no public
  signal per socket read, so that one subclasses its ``ResponseHandler`` (``TimedResponseHandler``,
  installed as the connector's protocol factory): pyproject pins aiohttp to the releases it is
  tested on, and tests/test_bench_client.py fails when a release breaks it. Where it cannot be
  installed, the client warns once and times each event as it is parsed.
* Tokens per chunk: from ``usage.completion_tokens`` on every chunk when the server sends it
  (vLLM's ``stream_options.continuous_usage_stats``, asked for only with ``--usage-per-chunk``:
  it costs vLLM's API server work on every token); else from the chunk's ``token_ids`` where the
  server sends them (vLLM's ``return_token_ids``); else each text chunk counts one token and,
  when the final ``usage`` (``include_usage``) says otherwise, the total is spread over the
  chunks in proportion to their text length.
* TTFT is the first chunk that carries output text; a role-only chunk does not count.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
from aiohttp.client_proto import ResponseHandler

from servefleet.records import RequestRecord

REPLICA_HEADERS = ("x-servefleet-replica", "x-replica", "x-upstream-replica")
"""Response headers that name the replica that served a request (a gateway's)."""


class TimedResponseHandler(ResponseHandler):
    """aiohttp's protocol, noting at each socket read (arrival time, payload bytes so far) of
    the response being read."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.marks: list[tuple[float, int]] = []
        self._marked_payload = None

    def data_received(self, data: bytes) -> None:
        t = time.perf_counter()
        super().data_received(data)
        p = getattr(self, "_payload", None)  # None too where a release renames it: no marks
        if p is None:
            return
        if p is not self._marked_payload:
            self._marked_payload = p
            self.marks = []
        self.marks.append((t, p.total_bytes))


KEEPALIVE = 4.0
"""Seconds an idle connection is reused: below uvicorn's 5 s (vLLM's server closes idle
connections then), so that no request goes out on a connection the server is closing."""


def make_connector(limit: int, reuse_connections: bool) -> aiohttp.TCPConnector:
    """aiohttp's connector, its connections timed at each socket read where this aiohttp
    allows (``read_times_hooked``)."""
    conn = aiohttp.TCPConnector(
        limit=limit,
        limit_per_host=0,
        force_close=not reuse_connections,
        keepalive_timeout=KEEPALIVE if reuse_connections else None,
        ttl_dns_cache=None,
    )
    factory = getattr(conn, "_factory", None)
    if isinstance(factory, functools.partial) and factory.func is ResponseHandler:
        conn._factory = functools.partial(TimedResponseHandler, *factory.args, **factory.keywords)
    else:  # shown once (the default warning filter)
        warnings.warn(
            f"aiohttp {aiohttp.__version__}: the bench cannot time socket reads (its "
            "connector's protocol factory changed); event times are taken as events are parsed, "
            "later under load. Install aiohttp in the range that pyproject.toml names.",
            RuntimeWarning,
            stacklevel=2,
        )
    return conn


def read_times_hooked(conn: aiohttp.BaseConnector) -> bool:
    """Whether ``conn``'s connections time each socket read (``TimedResponseHandler``)."""
    factory = getattr(conn, "_factory", None)
    return isinstance(factory, functools.partial) and factory.func is TimedResponseHandler


async def _on_body_sent(_session, ctx, _params) -> None:
    """``on_request_chunk_sent``: the body goes to the connection now (the last call wins)."""
    sent = ctx.trace_request_ctx
    if isinstance(sent, list):
        sent.append(time.perf_counter())


def send_times() -> aiohttp.TraceConfig:
    """The session's trace: each request's send time, through ``trace_request_ctx``."""
    tc = aiohttp.TraceConfig()
    tc.on_request_chunk_sent.append(_on_body_sent)
    return tc


@dataclass(slots=True)
class Request:
    """A ready-to-send request: the body already serialised, so sending costs no JSON work."""

    url: str
    body: bytes
    headers: dict[str, str]
    record: RequestRecord
    chat: bool
    keep_text: bool = False


@dataclass(slots=True)
class Outcome:
    record: RequestRecord
    text: str = ""
    chunk_chars: list[int] = field(default_factory=list)


class Client:
    """Sends ``Request``s on one aiohttp session. ``t0`` is the run's origin on perf_counter."""

    def __init__(
        self,
        *,
        max_connections: int = 0,
        reuse_connections: bool = True,
        timeout: float = 600.0,
        api_key: str | None = None,
    ):
        self.max_connections = max_connections
        self.reuse_connections = reuse_connections
        self.timeout = timeout
        self.api_key = api_key
        self.t0 = time.perf_counter()
        self.session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self.session = aiohttp.ClientSession(
            connector=make_connector(self.max_connections, self.reuse_connections),
            timeout=aiohttp.ClientTimeout(total=self.timeout, sock_connect=10.0),
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
            trace_configs=[send_times()],
        )

    async def stop(self) -> None:
        if self.session is not None:
            await self.session.close()
            self.session = None

    def base_headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    async def send(self, req: Request, on_chunk: Callable[[int], None] | None = None) -> Outcome:
        """Send and stream; every failure becomes the record's ``status``/``error``."""
        assert self.session is not None, "Client.start() first"
        rec = req.record
        out = Outcome(rec)
        t0 = self.t0
        rec.send_time = time.perf_counter() - t0
        sent: list[float] = []
        try:
            async with self.session.post(
                req.url, data=req.body, headers=req.headers, trace_request_ctx=sent
            ) as resp:
                if sent:
                    rec.send_time = sent[-1] - t0
                for h in REPLICA_HEADERS:
                    if h in resp.headers:
                        rec.replica = resp.headers[h]
                        break
                if resp.status != 200:
                    rec.end_time = time.perf_counter() - t0
                    _fail(rec, f"HTTP {resp.status}: {_error_message(await resp.read())}")
                    return out
                await _read_stream(resp, req, out, t0, on_chunk)
        except asyncio.CancelledError:
            rec.end_time = time.perf_counter() - t0
            rec.status, rec.error = "aborted", "aborted: interrupted"
            raise
        except aiohttp.ClientConnectorError as e:
            _fail(rec, f"connect: cannot reach {req.url}: {e.os_error or e}")
        except aiohttp.ServerDisconnectedError:
            _fail(rec, "disconnected: the server closed the connection mid-response")
        except aiohttp.ClientPayloadError as e:
            _fail(
                rec,
                "disconnected: the server closed the connection before the response was "
                f"complete ({type(e).__name__})",
            )
        except TimeoutError:
            _fail(rec, f"timeout: no complete response within {self.timeout:g} s")
        except aiohttp.ClientError as e:
            _fail(rec, f"client: {type(e).__name__}: {e}")
        if rec.end_time is None:
            rec.end_time = time.perf_counter() - t0
        return out


def _fail(rec: RequestRecord, error: str) -> None:
    rec.status, rec.error = "error", error


def _error_message(body: bytes) -> str:
    text = body.decode("utf-8", "replace").strip()
    try:
        obj = json.loads(text)
    except ValueError:
        return text[:200] or "(empty body)"
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict):
            return str(err.get("message") or err)[:200]
        return str(obj.get("message") or err)[:200]
    return text[:200]


async def _read_stream(resp, req: Request, out: Outcome, t0: float, on_chunk) -> None:
    rec = out.record
    conn = resp.connection
    proto = conn.protocol if conn is not None else None
    marks = getattr(proto, "marks", None)
    mark_i = 0
    consumed = 0  # payload bytes before ``buf``
    buf = b""
    texts: list[str] = []
    usage_total: int | None = None
    continuous = False
    by_ids = False  # every text chunk so far carried its token ids
    prev_usage = 0
    pending = 0  # tokens reported without text, carried to the next text chunk
    done = False
    async for data in resp.content.iter_any():
        now = time.perf_counter()
        buf += data
        while True:
            end = buf.find(b"\n\n")
            if end < 0:
                break
            event, buf = buf[:end], buf[end + 2 :]
            consumed += end + 2
            t = now
            if marks is not None:
                # the first socket read that brought this event's last byte
                while mark_i < len(marks) and marks[mark_i][1] < consumed:
                    mark_i += 1
                if mark_i < len(marks):
                    t = marks[mark_i][0]
            for line in event.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    done = True
                    continue
                try:
                    obj = json.loads(payload)
                except ValueError:
                    _fail(rec, f"stream: not JSON: {payload[:80]!r}")
                    return
                if "error" in obj or obj.get("object") == "error":
                    err = obj.get("error", obj)
                    msg = err.get("message") if isinstance(err, dict) else err
                    _fail(rec, f"stream: error event: {msg}")
                    rec.end_time = t - t0
                    return
                usage = obj.get("usage")
                k = 0
                if usage and usage.get("completion_tokens") is not None:
                    ct = int(usage["completion_tokens"])
                    if obj.get("choices"):
                        continuous = True
                        k = ct - prev_usage
                        prev_usage = ct
                    usage_total = ct
                    if usage.get("prompt_tokens") is not None:
                        rec.prompt_tokens = int(usage["prompt_tokens"])
                    details = usage.get("prompt_tokens_details") or {}
                    if details.get("cached_tokens") is not None:
                        rec.cached_tokens = int(details["cached_tokens"])
                choices = obj.get("choices") or ()
                if not choices:
                    continue
                ch = choices[0]
                text = _text_of(ch, req.chat)
                if ch.get("finish_reason"):
                    rec.finish_reason = ch["finish_reason"]
                if not text:
                    pending += k
                    continue
                if continuous:
                    tokens = k + pending
                else:
                    ids = ch.get("token_ids")
                    by_ids = ids is not None and (by_ids or not rec.chunk_times)
                    tokens = len(ids) if by_ids else 1
                pending = 0
                rec_t = t - t0
                if rec.first_token_time is None:
                    rec.first_token_time = rec_t
                rec.chunk_times.append(rec_t)
                rec.chunk_tokens.append(max(tokens, 0))
                texts.append(text)
                if on_chunk is not None:
                    on_chunk(tokens)
    rec.end_time = rec.chunk_times[-1] if rec.chunk_times else time.perf_counter() - t0
    if pending and rec.chunk_tokens:
        rec.chunk_tokens[-1] += pending
    if not continuous and not by_ids and usage_total is not None and rec.chunk_tokens:
        rec.chunk_tokens = spread(usage_total, [len(x) for x in texts])
    rec.output_tokens = usage_total if usage_total is not None else sum(rec.chunk_tokens)
    out.text = "".join(texts)
    if not done and rec.finish_reason is None:
        _fail(rec, "stream: ended without [DONE] or a finish_reason")


def _text_of(choice: dict, chat: bool) -> str:
    if chat:
        d = choice.get("delta") or {}
        return (d.get("content") or "") + (d.get("reasoning_content") or d.get("reasoning") or "")
    return choice.get("text") or ""


def spread(total: int, weights: list[int]) -> list[int]:
    """``total`` tokens over chunks in proportion to ``weights`` (their text lengths), by
    largest remainder; every chunk keeps at least one token when ``total`` allows."""
    n = len(weights)
    if n == 0:
        return []
    w = [max(x, 1) for x in weights]
    s = sum(w)
    ideal = [total * x / s for x in w]
    out = [int(v) for v in ideal]
    for i in sorted(range(n), key=lambda i: ideal[i] - out[i], reverse=True)[: total - sum(out)]:
        out[i] += 1
    if total >= n:
        for i in range(n):
            if out[i] == 0:
                out[out.index(max(out))] -= 1
                out[i] = 1
    return out
