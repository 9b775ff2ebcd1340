"""Forwarding one generation request: attempts, retries, the streaming relay, resumption.

* Before anything reaches the client, a connect error, a timeout, a 5xx or a connection cut
  is retried on another replica (``retry.max_attempts`` attempts in all, with backoff).
* The SSE relay forwards whole events as they arrive (cut at the last blank line of what was
  read), never the whole stream at once, and keeps the bytes it forwarded.
* A replica that fails after the client got part of a stream: the generation continues on
  another replica from the prompt plus the text already sent (``parse.resume_body``); the
  continuation's events are rewritten (``sse.Resumed``) so the client sees one stream. When
  that cannot be done, the stream ends with an error event and ``[DONE]``, never a hang.
* A client that goes away cancels the upstream request (its connection is closed).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from servefleet.gateway.config import GatewayConfig
from servefleet.gateway.errors import GatewayError
from servefleet.gateway.metrics import GatewayMetrics
from servefleet.gateway.parse import CHAT, ParsedRequest, resume_body
from servefleet.gateway.replica import Replica
from servefleet.gateway.router import Router
from servefleet.gateway.sse import DONE, Resumed, StreamLog
from servefleet.gateway.upstream import UpstreamConnection, request_head
from servefleet.routing import RequestContext

RETRYABLE_STATUS = frozenset({500, 502, 503, 504})
MAX_ERROR_BODY = 64 << 10
DONE_EVENT = DONE + b"\n\n"
WRITE_HIGH_WATER = 1 << 18
"""Bytes waiting in the client socket's buffer above which the relay waits for it to drain."""
_OK, _RETRY, _BROKEN = "ok", "retry", "broken"


class ClientGone(Exception):
    """The client closed its connection."""


@dataclass(slots=True)
class Outcome:
    status: int = 0
    replica: str = "none"
    decision: str = "none"
    attempts: int = 0
    resumes: int = 0
    ttft: float | None = None
    error: str | None = None
    expected_hit_tokens: int = 0


@dataclass(slots=True)
class _Call:
    """One client request being forwarded."""

    request: web.Request
    parsed: ParsedRequest
    ctx: RequestContext
    rid: str
    path: str
    body: bytes
    t0: float
    queue_time: float
    out: web.StreamResponse | None = None
    log: StreamLog | None = None
    resumed: Resumed | None = None
    done_seen: bool = False
    raw: bool = False
    transport: asyncio.Transport | None = None
    """The response's headers are out: body chunks may be written to the socket directly."""
    response: web.StreamResponse | None = None
    outcome: Outcome = field(default_factory=Outcome)
    failure: str = ""


class Forwarder:
    def __init__(
        self,
        cfg: GatewayConfig,
        router: Router,
        metrics: GatewayMetrics,
        on_failure,
    ) -> None:
        self.cfg = cfg
        self.router = router
        self.metrics = metrics
        self.on_failure = on_failure
        """Called with (replica, why) after a failed attempt (health kick, breaker)."""
        self._rng = random.Random()
        s = cfg.stream
        self.timeout = aiohttp.ClientTimeout(
            total=None,
            connect=s.connect_timeout,
            sock_connect=s.connect_timeout,
            sock_read=s.idle_timeout,
        )

    async def forward(
        self,
        request: web.Request,
        parsed: ParsedRequest,
        ctx: RequestContext,
        raw: bytes,
        path: str,
        rid: str,
        t0: float,
        queue_time: float,
    ) -> tuple[web.StreamResponse, Outcome]:
        call = _Call(request, parsed, ctx, rid, path, raw, t0, queue_time)
        if parsed.stream:
            call.log = StreamLog()
        oc = call.outcome
        tried: set[str] = set()
        failures = 0
        deadline = time.monotonic() + self.cfg.admission.max_queue_wait
        pending_resume = False
        while True:
            try:
                choice = await self.router.pick(ctx, parsed.model, tried, deadline)
            except GatewayError as exc:
                if call.out is None:
                    raise
                self.metrics.resumptions.labels("error").inc()
                return await self._stream_error(call, f"no replica to resume on: {exc.message}"), oc
            rep = choice.replica
            tried.add(rep.name)
            oc.attempts += 1
            if oc.replica == "none":
                oc.replica, oc.decision = rep.name, choice.decision
                oc.expected_hit_tokens = choice.expected_hit_tokens
            if pending_resume:
                finished = await self._prepare_resume(call, rep)
                pending_resume = False
                if finished:
                    return await self._end_stream(call), oc
            result = await self._attempt(call, rep, choice.predicted_ttft)
            if result == _OK:
                if call.response is not None:
                    return call.response, oc
                return await self._end_stream(call), oc
            self.on_failure(rep, call.failure)
            if call.log is not None and call.log.started:
                # the client has part of the stream: resume, or end it with an error event
                summ = call.log.summary()
                if summ.done or summ.finish_reason:
                    return await self._end_stream(call), oc
                can = self.cfg.stream.resume and parsed.resumable
                if not can or oc.resumes >= self.cfg.stream.max_resumes:
                    self.metrics.resumptions.labels("error").inc()
                    why = "the request cannot be resumed" if not can else "too many resumptions"
                    return await self._stream_error(
                        call, f"replica {rep.name} failed mid-stream ({call.failure}); {why}"
                    ), oc
                oc.resumes += 1
                self.metrics.resumptions.labels("resumed").inc()
                pending_resume = True
                tried = {rep.name}
                failures = 0
                continue
            failures += 1
            if failures >= self.cfg.retry.max_attempts:
                msg = (
                    f"The request failed on {failures} attempt(s); last: replica {rep.name}: "
                    f"{call.failure}."
                )
                if call.out is not None:  # the stream's headers are out, no event yet
                    return await self._stream_error(call, msg), oc
                raise GatewayError(502, msg, "upstream_error")
            self.metrics.retries.labels(call.failure.split(":")[0]).inc()
            r = self.cfg.retry
            await asyncio.sleep(
                min(r.backoff_max, r.backoff_base * 2 ** (failures - 1))
                * self._rng.uniform(0.5, 1.0)
            )

    # -- one attempt -----------------------------------------------------------------------
    async def _attempt(self, call: _Call, rep: Replica, predicted_raw: float | None) -> str:
        ctx = call.ctx
        pt, mt = ctx.prompt_tokens, ctx.max_tokens
        session = rep.session
        if session is None:
            call.failure = "closed"
            return _RETRY
        if call.parsed.stream and rep.pool is not None and self.cfg.stream.lean_client:
            return await self._attempt_stream(call, rep, predicted_raw)
        rep.begin(pt, mt)
        self.metrics.routed_prompt_tokens_of(rep.name).inc(pt)
        first = False
        t_sent = time.monotonic()
        try:
            async with session.post(
                rep.url + call.path,
                data=call.body,
                headers=rep.upstream_headers(call.rid, call.request.headers.get("Authorization")),
                timeout=self.timeout,
            ) as up:
                if up.status != 200:
                    body = await up.content.read(MAX_ERROR_BODY)
                    if _retryable(call, rep, up.status, body):
                        return _RETRY
                    first = True
                    rep.first_token(pt)
                    rep.breaker.record_success()
                    return await self._client_error(call, rep, up.status, body, up.content_type)
                if not call.parsed.stream:
                    body = await up.read()
                    first = True
                    rep.first_token(pt)
                    self._first_byte(call, rep, t_sent, predicted_raw)
                    call.response = web.Response(
                        status=200, body=body, content_type="application/json",
                        headers=self._headers(call, rep),
                    )  # fmt: skip
                    rep.breaker.record_success()
                    return _OK
                buf = b""
                async for data in up.content.iter_any():
                    if not first:
                        first = True
                        rep.first_token(pt)
                        self._first_byte(call, rep, t_sent, predicted_raw)
                    buf += data
                    cut = buf.rfind(b"\n\n")
                    if cut < 0:
                        continue
                    cut += 2
                    out, buf = buf[:cut], buf[cut:]
                    await self._relay(call, rep, out)
                return _stream_ended(call, rep)
        except ClientGone:
            raise
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            call.failure = f"{_kind(exc)}: {exc}"[:300]
            rep.note_error(_kind(exc), str(exc)[:200])
            return _BROKEN if first else _RETRY
        finally:
            rep.end(pt, mt, first)
            self.router.replicas.notify()

    async def _attempt_stream(self, call: _Call, rep: Replica, predicted_raw: float | None) -> str:
        """A streamed attempt on the lean client (``upstream``): the relay writes events to
        the client from the connection's callbacks; this coroutine only starts the response,
        waits out backpressure, and decides the outcome."""
        assert rep.pool is not None
        ctx = call.ctx
        pt, mt = ctx.prompt_tokens, ctx.max_tokens
        rep.begin(pt, mt)
        self.metrics.routed_prompt_tokens_of(rep.name).inc(pt)
        relay: _StreamRelay | None = None
        conn = None
        try:
            try:
                conn = await rep.pool.acquire()
            except (OSError, TimeoutError) as exc:
                call.failure = f"connect_error: {exc}"[:300]
                rep.note_error("connect_error", str(exc)[:200])
                return _RETRY
            headers = rep.upstream_headers(call.rid, call.request.headers.get("Authorization"))
            head = request_head(
                "POST", rep.host_header, rep.path_prefix + call.path, headers, len(call.body)
            )
            relay = _StreamRelay(self, call, rep, conn, predicted_raw)
            conn.send(head, call.body, relay)
            return await relay.run()
        except BaseException:
            if conn is not None:
                conn.close()
            raise
        finally:
            rep.end(pt, mt, relay is not None and relay.first)
            self.router.replicas.notify()

    def _first_byte(
        self, call: _Call, rep: Replica, t_sent: float, predicted_raw: float | None
    ) -> None:
        now = time.monotonic()
        if predicted_raw:
            rep.learn_latency(predicted_raw, now - t_sent)
        if call.outcome.ttft is None:
            call.outcome.ttft = now - call.t0

    def _filter(self, call: _Call, out: bytes) -> bytes:
        """Events about to go to the client: a continuation's rewritten; logged; [DONE] noted."""
        if call.resumed is not None:
            kept = []
            for ev in out.split(b"\n\n"):
                if ev.strip():
                    ev2 = call.resumed.rewrite(ev)
                    if ev2 is not None:
                        kept.append(ev2 + b"\n\n")
            out = b"".join(kept)
            if not out:
                return out
        if out.endswith(DONE_EVENT):
            call.done_seen = True
        assert call.log is not None
        call.log.add(out)
        return out

    async def _relay(self, call: _Call, rep: Replica, out: bytes) -> None:
        out = self._filter(call, out)
        if out:
            await self._write_out(call, rep, out)

    async def _write_out(self, call: _Call, rep: Replica, out: bytes) -> None:
        if call.out is None:
            await self._prepare(call, rep)
        assert call.out is not None
        if call.raw and write_raw(call, out):
            return
        try:
            await call.out.write(out)
        except (ConnectionError, RuntimeError) as exc:
            raise ClientGone(str(exc)) from None
        call.raw = True

    def _headers(self, call: _Call, rep: Replica) -> dict[str, str]:
        return {
            "X-Request-Id": call.rid,
            "X-Servefleet-Replica": rep.name,
            "X-Servefleet-Queue-Time": f"{call.queue_time:.6f}",
            "X-Servefleet-Decision": call.outcome.decision,
        }

    async def _prepare(self, call: _Call, rep: Replica) -> None:
        resp = web.StreamResponse(
            status=200,
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
                **self._headers(call, rep),
            },
        )
        try:
            await resp.prepare(call.request)
        except (ConnectionError, RuntimeError) as exc:
            raise ClientGone(str(exc)) from None
        call.out = resp
        call.outcome.status = 200

    async def _client_error(
        self, call: _Call, rep: Replica, status: int, body: bytes, ctype: str
    ) -> str:
        """The replica refused the request (4xx): pass its answer on (or, mid-stream, end
        the stream with it)."""
        if call.out is None:
            call.response = web.Response(
                status=status, body=body, content_type=ctype or "application/json",
                headers=self._headers(call, rep),
            )  # fmt: skip
            call.outcome.status = status
            return _OK
        try:
            msg = json.loads(body).get("error", {}).get("message", "")
        except (ValueError, AttributeError):
            msg = body[:200].decode(errors="replace")
        call.failure = f"resume refused: HTTP {status}: {msg}"
        await self._stream_error(call, call.failure)
        return _OK

    # -- ends of streams -------------------------------------------------------------------
    async def _end_stream(self, call: _Call) -> web.StreamResponse:
        out = call.out
        assert out is not None
        try:
            if not call.done_seen:
                call.done_seen = True
                await out.write(DONE_EVENT)
            await out.write_eof()
        except (ConnectionError, RuntimeError) as exc:
            raise ClientGone(str(exc)) from None
        return out

    async def _stream_error(self, call: _Call, message: str) -> web.StreamResponse:
        err = GatewayError(502, message, "upstream_failed_mid_stream")
        call.outcome.error = message
        out = call.out
        assert out is not None
        try:
            await out.write(err.sse_event() + DONE_EVENT)
            call.done_seen = True
            await out.write_eof()
        except (ConnectionError, RuntimeError) as exc:
            raise ClientGone(str(exc)) from None
        return out

    async def _prepare_resume(self, call: _Call, rep: Replica) -> bool:
        """Set the continuation's body; True when nothing is left to generate."""
        assert call.log is not None
        summ = call.log.summary()
        parsed = call.parsed
        n = await self.count_tokens(rep, parsed.model, summ.text)
        if n is None:
            n = summ.content_events
        if parsed.max_tokens is not None and n >= parsed.max_tokens:
            return True
        call.body = json.dumps(resume_body(parsed, summ.text, n)).encode()
        call.resumed = Resumed(parsed.kind == CHAT, n)
        call.done_seen = False
        return False

    async def count_tokens(self, rep: Replica, model: str | None, text: str) -> int | None:
        """Tokens of ``text`` by the replica's own tokenizer (``/tokenize``), or None."""
        if not text:
            return 0
        if rep.session is None:
            return None
        body = {"prompt": text, "add_special_tokens": False}
        if model is not None:
            body["model"] = model
        try:
            async with rep.session.post(
                rep.url + "/tokenize",
                json=body,
                headers=rep.upstream_headers("tokenize", None),
                timeout=aiohttp.ClientTimeout(total=self.cfg.stream.connect_timeout),
            ) as resp:
                if resp.status != 200:
                    return None
                data = await resp.json()
                count = data.get("count")
                return count if isinstance(count, int) else None
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
            return None


def write_raw(call: _Call, out: bytes) -> bool:
    """After the first write (which carries the headers), events go straight to the client's
    socket in chunked framing, as aiohttp's writer would frame them. False when the socket's
    buffer is full (the caller then waits for it to drain through aiohttp's writer)."""
    tr = call.transport
    if tr is None:
        tr = call.transport = call.request.transport
    if tr is None or tr.is_closing():
        raise ClientGone("the client closed the connection")
    if tr.get_write_buffer_size() >= WRITE_HIGH_WATER:
        return False
    tr.write(b"%x\r\n%s\r\n" % (len(out), out))
    return True


def _retryable(call: _Call, rep: Replica, status: int, body: bytes) -> bool:
    """A replica's error status worth another replica (noted as the attempt's failure)."""
    if status not in RETRYABLE_STATUS:
        return False
    call.failure = f"http_{status}"
    rep.note_error("http", f"{status} {body[:120]!r}")
    return True


def _stream_ended(call: _Call, rep: Replica) -> str:
    """The outcome of a stream whose connection ended: whole only if `[DONE]` came."""
    if not call.done_seen:
        call.failure = "eof: the replica ended the stream early"
        rep.note_error("stream", call.failure)
        return _BROKEN
    rep.breaker.record_success()
    return _OK


def _kind(exc: BaseException) -> str:
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "connect_error"
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return "disconnected"
    return "transport_error"


class _StreamRelay:
    """The sink of one streamed attempt (see ``upstream.Sink``)."""

    def __init__(
        self,
        fw: Forwarder,
        call: _Call,
        rep: Replica,
        conn: UpstreamConnection,
        predicted_raw: float | None,
    ) -> None:
        self.fw, self.call, self.rep, self.conn = fw, call, rep, conn
        self.predicted_raw = predicted_raw
        self.loop = asyncio.get_running_loop()
        self.t_sent = time.monotonic()
        self.last = self.loop.time()
        self.status = 0
        self.ctype = ""
        self.err_body = bytearray()
        self.first = False
        self.buf = b""
        self.pending: list[bytes] = []
        self.ended = False
        self.error: BaseException | None = None
        self.client_gone = False
        self.idle_out = False
        self.head_ok = False
        self._wake: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    # -- callbacks from the connection -------------------------------------------------------
    def on_head(self, status: int, headers: dict[str, str]) -> None:
        self.status = status
        self.ctype = headers.get("content-type", "application/json").split(";")[0]
        self.last = self.loop.time()
        if status == 200 and self.call.out is None:
            self.head_ok = True
            self._wakeup()

    def on_data(self, data: bytes) -> None:
        self.last = self.loop.time()
        if self.status != 200:
            if len(self.err_body) < MAX_ERROR_BODY:
                self.err_body += data
            return
        call = self.call
        if not self.first:
            self.first = True
            self.rep.first_token(call.ctx.prompt_tokens)
            self.fw._first_byte(call, self.rep, self.t_sent, self.predicted_raw)
        buf = self.buf + data
        cut = buf.rfind(b"\n\n")
        if cut < 0:
            self.buf = buf
            return
        cut += 2
        out, self.buf = buf[:cut], buf[cut:]
        out = self.fw._filter(call, out)
        if not out:
            return
        if call.raw and not self.pending:
            try:
                if write_raw(call, out):
                    return
            except ClientGone:
                self.client_gone = True
                self._wakeup()
                return
        self.pending.append(out)
        self.conn.pause()
        self._wakeup()

    def on_end(self) -> None:
        self.ended = True
        self._wakeup()

    def on_error(self, exc: BaseException) -> None:
        self.error = exc
        self._wakeup()

    def _wakeup(self) -> None:
        w = self._wake
        if w is not None and not w.done():
            w.set_result(None)

    def _on_timer(self) -> None:
        """One timer per attempt, re-armed at ``last + idle_timeout`` when it finds that data
        came meanwhile (no timer per wait or per chunk)."""
        due = self.last + self.fw.cfg.stream.idle_timeout
        if self.loop.time() < due:
            self._timer = self.loop.call_at(due, self._on_timer)
            return
        self._timer = None
        self.idle_out = True
        self._wakeup()

    # -- the attempt's coroutine ---------------------------------------------------------------
    async def run(self) -> str:
        self._timer = self.loop.call_at(self.last + self.fw.cfg.stream.idle_timeout, self._on_timer)
        try:
            return await self._run()
        finally:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

    async def _start_response(self) -> None:
        """The replica answered 200: send the client the stream's headers now, while the
        replica computes the first token (as Nginx does), so that the first event, like every
        later one, goes out from ``on_data`` in one write, off the coroutine's path."""
        call = self.call
        await self.fw._prepare(call, self.rep)
        assert call.out is not None
        try:
            await call.out.write(b"")  # aiohttp holds the headers back until a write
        except (ConnectionError, RuntimeError) as exc:
            raise ClientGone(str(exc)) from None
        call.raw = True

    async def _run(self) -> str:
        call, rep, fw = self.call, self.rep, self.fw
        idle = fw.cfg.stream.idle_timeout
        while True:
            if self.client_gone:
                raise ClientGone("the client closed the connection")
            if self.pending:
                out = b"".join(self.pending)
                self.pending.clear()
                await fw._write_out(call, rep, out)
                self.conn.resume()
                continue
            if self.error is not None:
                exc = self.error
                kind = "timeout" if isinstance(exc, TimeoutError) else "disconnected"
                call.failure = f"{kind}: {exc}"[:300]
                rep.note_error(kind, str(exc)[:200])
                return _BROKEN if self.first else _RETRY
            if self.ended:
                break
            if self.head_ok and call.out is None:
                await self._start_response()
                continue
            if self.idle_out:
                self.conn.close()
                self.error = TimeoutError(f"the replica sent nothing for {idle:g} s")
                continue
            self._wake = self.loop.create_future()
            try:
                await self._wake
            finally:
                self._wake = None
        if self.status != 200:
            body = bytes(self.err_body)
            if _retryable(call, rep, self.status, body):
                return _RETRY
            self.first = True
            rep.first_token(call.ctx.prompt_tokens)
            rep.breaker.record_success()
            return await fw._client_error(call, rep, self.status, body, self.ctype)
        return _stream_ended(call, rep)
