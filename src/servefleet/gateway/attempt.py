"""One try of a request on one replica, and what came of it (a ``Result``).

The attempt is the sink of an upstream connection (``upstream.Sink``): the replica's answer
arrives in callbacks. A stream's events go to the client from there (``StreamState.push``);
any other answer is kept whole. The coroutine (``run``) only starts the client's response,
waits out a full client socket, and turns the end into an outcome (``retry.py``):

  200 text/event-stream   relayed event by event; OK when ``[DONE]`` came, else FAULT
  200 anything else       kept whole and passed on as it is: OK (a body the replica read
                          as non-streaming is answered as such, whatever the gateway thought)
  4xx (not 408/429)       CLIENT_ERROR: the replica's answer passes on
  429, 503                OVERLOADED (with its Retry-After)
  other status, a cut     FAULT, with a reason two replicas failing alike share
  connection, silence
  for ``idle_timeout``,
  ``abort()``             FAULT: the replica was ejected or found hung while this ran
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

from aiohttp import web

from servefleet.gateway.config import StreamConfig
from servefleet.gateway.parse import ParsedRequest
from servefleet.gateway.replica import Replica
from servefleet.gateway.retry import CLIENT_ERROR, FAULT, OK, OVERLOADED
from servefleet.gateway.stream import ClientGone, StreamState
from servefleet.gateway.watchdog import first_token_limit
from servefleet.routing import RequestContext

MAX_ERROR_BODY = 64 << 10
OVERLOAD_STATUS = frozenset({429, 503})
NOT_CLIENT_4XX = frozenset({408, 429})
"""4xx answers that are not the request's fault (a timeout, a busy replica)."""


@dataclass(slots=True)
class Outcome:
    """What the request log and metrics say about a forwarded request."""

    status: int = 0
    replica: str = "none"
    decision: str = "none"
    attempts: int = 0
    resumes: int = 0
    ttft: float | None = None
    error: str | None = None
    expected_hit_tokens: int = 0


@dataclass(slots=True)
class Call:
    """One client request being forwarded."""

    request: web.Request
    parsed: ParsedRequest
    ctx: RequestContext
    rid: str
    path: str
    body: bytes
    t0: float
    queue_time: float
    auth: str | None
    """The client's Authorization header (passed on when the replica has no api_key)."""
    stream: StreamState | None = None
    outcome: Outcome = field(default_factory=Outcome)

    def headers(self, replica: str) -> dict[str, str]:
        return {
            "X-Request-Id": self.rid,
            "X-Servefleet-Replica": replica,
            "X-Servefleet-Queue-Time": f"{self.queue_time:.6f}",
            "X-Servefleet-Decision": self.outcome.decision,
        }


@dataclass(slots=True)
class Result:
    kind: str
    """OK, CLIENT_ERROR, OVERLOADED or FAULT (``retry.py``)."""
    status: int = 0
    reason: str = ""
    body: bytes = b""
    content_type: str = "application/json"
    retry_after: float | None = None
    connect: bool = False
    """Failed before anything was sent."""

    def response(self, headers: dict[str, str]) -> web.Response:
        """The replica's answer, passed on as it is."""
        return web.Response(
            status=self.status, body=self.body, content_type=self.content_type, headers=headers
        )


_HEAD, _SSE, _BODY, _ERROR = range(4)


class EventTooLarge(Exception):
    """The replica sent an SSE event longer than ``stream.max_event_bytes``."""


class Attempt:
    """The sink of one attempt (``upstream.Sink``) and its coroutine (``run``)."""

    def __init__(
        self,
        call: Call,
        rep: Replica,
        body: bytes,
        cfg: StreamConfig,
        predicted_raw: float | None,
    ) -> None:
        self.call, self.rep, self.body, self.cfg = call, rep, body, cfg
        self.predicted_raw = predicted_raw
        self.loop = asyncio.get_running_loop()
        self.t_sent = 0.0
        self.last = self.loop.time()
        self.mode = _HEAD
        self.status = 0
        self.ctype = "application/json"
        self.retry_after: float | None = None
        self.data = bytearray()
        self.first = False
        self.streaming = False
        """Counted in the replica's ``streaming`` (its stream has begun)."""
        self.buf = b""
        self.pending: list[bytes] = []
        self.ended = False
        self.error: BaseException | None = None
        self.aborted: str | None = None
        self.client_gone = False
        self.paused = False
        """Reading from the replica is paused while the client's socket is full."""
        self.resent = False
        """Sent again on a new connection (a reused one was closed before answering)."""
        self.waiting_since: float | None = None
        """Loop time since which a stream waits for its first event (the watchdog's)."""
        self.first_deadline = 0.0
        self.idle_out = False
        self.conn = None
        self._wake: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    # -- from outside ----------------------------------------------------------------------
    def abort(self, why: str) -> None:
        """Give up on this replica now (it was ejected, or found hung)."""
        if self.aborted is None and not self.ended:
            self.aborted = why
            if self.conn is not None:
                self.conn.close()
            self._wakeup()

    # -- callbacks from the connection -------------------------------------------------------
    def on_head(self, status: int, headers: dict[str, str]) -> None:
        self.status = status
        self.ctype = headers.get("content-type", "application/json").split(";")[0].strip()
        self.last = self.loop.time()
        if status == 200:
            sse = self.ctype == "text/event-stream"
            self.mode = _SSE if sse and self.call.stream is not None else _BODY
            if self.mode == _SSE and not self.call.stream.open:  # type: ignore[union-attr]
                self._wakeup()  # send the client the stream's headers now
        if self.mode != _SSE:
            self.waiting_since = None  # an answer that is not a stream comes whole
        if status != 200:
            self.mode = _ERROR
            ra = headers.get("retry-after", "")
            self.retry_after = float(ra) if ra.replace(".", "", 1).isdigit() else None

    def on_data(self, data: bytes) -> None:
        now = self.loop.time()
        if self.mode != _SSE:
            if self.mode == _BODY or len(self.data) < MAX_ERROR_BODY:
                self.data += data
            self.last = now
            return
        call, rep = self.call, self.rep
        if not self.first:
            self.first = self.streaming = True
            self.waiting_since = None
            rep.first_token(call.ctx.prompt_tokens)
            rep.streaming += 1
            rep.note_progress(now, None)
            rep.learn_ttft(time.monotonic() - self.t_sent, call.ctx.prompt_tokens)
            self._first_byte()
        else:
            rep.note_progress(now, now - self.last)
        self.last = now
        buf = self.buf + data
        cut = buf.rfind(b"\n\n")
        if cut < 0:
            self.buf = buf
            self._check_event(buf)
            return
        cut += 2
        out, self.buf = buf[:cut], buf[cut:]
        self._check_event(self.buf)
        state = call.stream
        assert state is not None
        out = state.take(out)
        if not out:
            return
        if state.open and not self.pending:
            try:
                if state.push(out):
                    return
            except ClientGone:
                self.client_gone = True
                self._wakeup()
                return
        self.pending.append(out)
        self._pause()
        self._wakeup()

    def _check_event(self, partial: bytes) -> None:
        """An event still unfinished must stay within ``max_event_bytes`` (else the replica
        has failed: its connection is dropped)."""
        if len(partial) > self.cfg.max_event_bytes and self.error is None:
            self.error = EventTooLarge(
                f"an event longer than {self.cfg.max_event_bytes} bytes (stream.max_event_bytes)"
            )
            self.buf = b""
            if self.conn is not None:
                self.conn.close()
            self._wakeup()

    def _pause(self) -> None:
        """The client's socket is full: stop reading the replica until it drains. The
        stream no longer counts in the replica's ``streaming`` (the watchdog's evidence):
        the wait is the client's doing."""
        if self.paused:
            return
        self.paused = True
        if self.conn is not None:
            self.conn.pause()
        if self.streaming:
            self.rep.streaming -= 1

    def _resume(self) -> None:
        if not self.paused:
            return
        self.paused = False
        now = self.loop.time()
        self.last = now  # the replica's silence is timed from here, not from the pause
        if self.streaming:
            rep = self.rep
            if rep.streaming == 0:  # no other stream to judge it by: start its clock now
                rep.progress_at = max(rep.progress_at, now)
            rep.streaming += 1
        if self.conn is not None:
            self.conn.resume()

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

    def _first_byte(self) -> None:
        now = time.monotonic()
        if self.predicted_raw:
            self.rep.learn_latency(self.predicted_raw, now - self.t_sent)
        oc = self.call.outcome
        if oc.ttft is None:
            oc.ttft = now - self.call.t0

    def _limit(self) -> float:
        """Seconds of silence that end the attempt: between a stream's events, or before its
        head (``idle_timeout``); a non-streamed answer comes whole (``response_timeout``)."""
        if self.mode == _SSE or (self.mode == _HEAD and self.call.stream is not None):
            return self.cfg.idle_timeout
        return self.cfg.response_timeout

    def _on_timer(self) -> None:
        """One timer per attempt, re-armed when it finds that data came meanwhile."""
        due = self.last + self._limit()
        if self.paused:  # waiting for the client: not the replica's silence
            due = self.loop.time() + self._limit()
        if self.loop.time() < due:
            self._timer = self.loop.call_at(due, self._on_timer)
            return
        self._timer = None
        self.idle_out = True
        self._wakeup()

    # -- the attempt's coroutine ---------------------------------------------------------------
    async def run(self) -> Result:
        call, rep = self.call, self.rep
        pt, mt = call.ctx.prompt_tokens, call.ctx.max_tokens
        rep.begin(pt, mt)
        rep.attempts.add(self)
        self.t_sent = time.monotonic()
        try:
            head = rep.pool.head("POST", call.path, rep.upstream_headers(call.rid, call.auth),
                                 len(self.body))  # fmt: skip
            fresh = False
            while True:  # twice at most: once more when a reused connection was stale
                try:
                    self.conn = conn = await rep.pool.acquire(fresh)
                except (OSError, TimeoutError) as exc:
                    why = f"connect_error: {type(exc).__name__}: {exc}"[:300]
                    rep.note_error("connect_error", why)
                    return Result(FAULT, reason="connect_error", connect=True)
                if self.aborted is not None:
                    conn.close()
                    return self._fault(self.aborted)
                conn.send(head, self.body, self)
                self.last = self.loop.time()
                if call.stream is not None and not fresh:
                    self.waiting_since = self.last
                    self.first_deadline = first_token_limit(self.cfg, rep.expected_ttft(pt))
                if self._timer is None:
                    self._timer = self.loop.call_at(self.last + self._limit(), self._on_timer)
                res = await self._run()
                if res is not None:
                    return res
                fresh = True
        except BaseException:
            if self.conn is not None:
                self.conn.close()
            raise
        finally:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            rep.attempts.discard(self)
            if self.streaming and not self.paused:
                rep.streaming -= 1
            rep.end(pt, mt, self.first)

    async def _run(self) -> Result | None:
        state = self.call.stream
        while True:
            if self.client_gone:
                raise ClientGone("the client closed the connection")
            if self.pending:
                assert state is not None
                data = b"".join(self.pending)
                self.pending.clear()
                if not state.open:
                    await self._start(state)
                if not state.push(data):
                    await state.write(data)
                if not self.pending:
                    self._resume()
                continue
            if self.aborted is not None:
                return self._fault(self.aborted)
            if self.error is not None:
                if isinstance(self.error, TimeoutError):
                    return self._fault("timeout")
                if isinstance(self.error, EventTooLarge):
                    return self._fault("event_too_large", str(self.error))
                if self.conn is not None and self.rep.pool.stale(self.conn, self.resent):
                    self.resent, self.error = True, None
                    return None  # the request was never read: once more, on a new connection
                return self._fault("disconnected", str(self.error))
            if self.ended:
                return self._ended()
            if self.idle_out:
                assert self.conn is not None
                self.conn.close()
                return self._fault("timeout", f"the replica sent nothing for {self._limit():g} s")
            if self.mode == _SSE and state is not None and not state.open:
                await self._start(state)
                continue
            self._wake = self.loop.create_future()
            try:
                await self._wake
            finally:
                self._wake = None

    async def _start(self, state: StreamState) -> None:
        """The client's stream begins here: this replica serves it (first, if resumed)."""
        self.call.outcome.replica = self.rep.name
        await state.start(self.call.headers(self.rep.name))

    def _fault(self, reason: str, detail: str = "") -> Result:
        self.rep.note_error(reason.split(":")[0], (detail or reason)[:200])
        return Result(FAULT, self.status, reason)

    def _ended(self) -> Result:
        status = self.status
        if self.mode == _SSE:
            if self.call.stream is not None and self.call.stream.done_seen:
                return Result(OK, 200)
            return self._fault("eof", "the replica ended the stream before [DONE]")
        body = bytes(self.data)
        if self.mode == _BODY:
            if self.call.stream is not None and self.call.stream.open:
                return self._fault("not_a_stream", "a continuation answered without a stream")
            self.first = True
            self.rep.first_token(self.call.ctx.prompt_tokens)
            self.rep.note_progress(self.loop.time(), None)  # its engine works
            self._first_byte()
            return Result(OK, 200, body=body, content_type=self.ctype)
        if status in OVERLOAD_STATUS:
            self.rep.note_error("overloaded", f"HTTP {status}")
            return Result(OVERLOADED, status, f"http {status}", body, self.ctype, self.retry_after)
        if 400 <= status < 500 and status not in NOT_CLIENT_4XX:
            return Result(CLIENT_ERROR, status, _message(body), body, self.ctype)
        res = self._fault(f"http {status}: {_message(body)[:120]}")
        res.body, res.content_type = body, self.ctype
        return res


def _message(body: bytes) -> str:
    """The error message of a replica's answer (vLLM's ``{"error": {"message"}}``)."""
    try:
        err = json.loads(body).get("error")
        msg = err.get("message") if isinstance(err, dict) else err
        return str(msg) if msg is not None else ""
    except (ValueError, AttributeError):
        return body[:200].decode(errors="replace")
