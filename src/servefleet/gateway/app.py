"""The gateway: an OpenAI-compatible HTTP front for a fleet of vLLM replicas.

``Gateway`` wires the parts, each in its own module and with its own ``start``/``stop``:
replicas and their connections (``replica``, ``upstream``), active health checks
(``health``), hung-replica detection (``watchdog``), the scraper of the replicas' metrics
(``scrape``), identity and admission (``identity``, ``ratelimit``, ``admission``), forwarding
(``proxy``), metrics (``metrics``). The routing policy comes from ``servefleet.routing`` and
is the only place where a replica is chosen.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models``,
``POST /tokenize``, ``POST /detokenize``, ``GET /health``, ``GET /ready``; the operator's
``GET /metrics``, ``GET /fleet`` (behind ``admin_token`` when listening beyond loopback);
with an admin token, ``GET|POST /admin/replicas``, ``DELETE /admin/replicas/{name}``,
``POST /admin/reload``. Every error, aiohttp's own included, is OpenAI-shaped JSON.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import math
import random
import time
from collections.abc import Callable
from pathlib import Path

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError
from pydantic import ValidationError

from servefleet.aiohttp_util import bind_lifecycle
from servefleet.gateway.admission import Admission, Budget, PerClient
from servefleet.gateway.attempt import Call
from servefleet.gateway.breaker import STATE_VALUE
from servefleet.gateway.config import ConfigError, GatewayConfig, ReplicaConfig, load_config
from servefleet.gateway.discovery import discovered, start_discovery
from servefleet.gateway.errors import GatewayError
from servefleet.gateway.health import HealthChecker
from servefleet.gateway.identity import KeyStore
from servefleet.gateway.log import event, log, where
from servefleet.gateway.metrics import GatewayMetrics
from servefleet.gateway.parse import CHAT, COMPLETIONS, ParsedRequest, load_json, parse_request
from servefleet.gateway.proxy import Forwarder, tokenize_count
from servefleet.gateway.ratelimit import RedisLimiter, make_limiter, tier_limits
from servefleet.gateway.replica import HEALTHY, UNHEALTHY, Replica, ReplicaSet
from servefleet.gateway.router import Router
from servefleet.gateway.scrape import MetricsScraper
from servefleet.gateway.stream import ClientGone, ClientTooSlow, StreamState
from servefleet.gateway.watchdog import Watchdog
from servefleet.routing import PREFIX_HASHES, RequestContext, make_policy

DEFAULT_MAX_TOKENS = 256
"""Output tokens assumed for load bookkeeping when a chat request sets no max_tokens."""
TOKENIZE_TIMEOUT = 2.0
BODY_SLACK = 64 << 10
"""Bytes of a body beyond its prompts (the other fields, JSON) in the body limit."""
MAX_REQUEST_ID = 128
try:
    HELD = web.RequestKey("servefleet_body_bytes", int)
except AttributeError:  # aiohttp before 3.12: a plain key
    HELD = "servefleet_body_bytes"  # type: ignore[assignment]
"""Where a request notes the bytes of its body held in ``Gateway.bodies``."""


def loopback(host: str) -> bool:
    """Whether listening on ``host`` reaches this machine only."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def header_value(request: web.Request, name: str) -> str | None:
    """A header the gateway passes on: printable ASCII only, else 400 (it could not be sent
    upstream as it came, and a replica would not read it)."""
    v = request.headers.get(name)
    if v is None or (v.isascii() and v.isprintable()):
        return v
    raise GatewayError(400, f"The {name} header must be printable ASCII.", "invalid_header")


class Gateway:
    def __init__(
        self,
        cfg: GatewayConfig,
        config_path: Path | None = None,
        loader: Callable[[Path], GatewayConfig] = load_config,
    ) -> None:
        self.cfg = cfg
        self.config_path = config_path
        self.loader = loader
        """How a reload reads ``config_path`` (a fleet.yaml's reader for `--config fleet.yaml`)."""
        self.metrics = GatewayMetrics()
        self.policy = make_policy(cfg.policy.name, **cfg.policy.options)
        self.replicas = ReplicaSet(cfg)
        self.router = Router(self.replicas, self.policy, cfg.health.panic_threshold)
        self.health = HealthChecker(self.replicas, cfg.health, self._on_health)
        self.scraper = MetricsScraper(self.replicas, cfg.scrape_interval, self._on_scrape)
        self.watchdog = Watchdog(self.replicas, cfg.stream, self._on_hung)
        a = cfg.admission
        self.admission = Admission(a.max_concurrency, a.max_queue, a.max_queue_wait)
        self.streams = PerClient(a.max_streams_per_client)
        """Streams open per client (identity.py's user)."""
        self.bodies = Budget(cfg.server.max_buffered_bytes)
        """Bytes of request bodies held, all requests together."""
        self.limiter = make_limiter(
            cfg.rate_limit,
            self.metrics.ratelimit_degraded.set,
            self.metrics.ratelimit_fallbacks.inc,
        )
        self.tiers = tier_limits(cfg.rate_limit)
        redis = self.limiter.redis if isinstance(self.limiter, RedisLimiter) else None
        self.keys = KeyStore(cfg.auth, redis)
        self.forwarder = Forwarder(
            cfg, self.router, self.metrics, self._on_failure, self.health.kick, self._on_down
        )
        self.draining = False
        self.in_flight = 0
        self.ops_open = loopback(cfg.host)
        """Listening on loopback only: /fleet and /metrics need no token."""
        self._prefixes = PREFIX_HASHES in self.policy.needs
        self._rid = random.Random()
        # gauges read when /metrics is scraped, not updated per request
        self.metrics.in_flight.set_function(lambda: self.in_flight)
        self.metrics.queued.set_function(lambda: self.admission.queued)
        self._idle = asyncio.Event()
        self._idle.set()
        self._tok_rr = 0
        self.replicas.on_added.append(self.health.watch)
        self.replicas.on_removed.append(self._on_removed)
        self.discovery = None

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        for rc in self.cfg.replicas:
            await self.replicas.add(rc)
        self.discovery = await start_discovery(self.cfg, self.replicas)
        await self.health.start()
        await self.scraper.start()
        await self.watchdog.start()

    async def drain(self, timeout: float) -> bool:
        """Stop taking requests; wait up to ``timeout`` s for those in flight. True if all
        finished."""
        self.draining = True
        event(logging.INFO, "draining", in_flight=self.in_flight, timeout_s=timeout)
        try:
            async with asyncio.timeout(timeout):
                await self._idle.wait()
            return True
        except TimeoutError:
            return False

    async def stop(self) -> None:
        self.draining = True
        await self.watchdog.stop()
        if self.discovery is not None:
            await self.discovery.stop()
        await self.scraper.stop()
        await self.health.stop()
        await self.replicas.close(0.0)
        if self.limiter is not None:
            await self.limiter.close()

    def build_app(self) -> web.Application:
        app = web.Application(
            client_max_size=self.cfg.admission.max_body_bytes, middlewares=[self._errors]
        )
        r = app.router
        r.add_post("/v1/completions", self.completions)
        r.add_post("/v1/chat/completions", self.chat_completions)
        r.add_get("/v1/models", self.models)
        r.add_post("/tokenize", self.tokenize_route)
        r.add_post("/detokenize", self.tokenize_route)
        r.add_get("/health", self.health_route)
        r.add_get("/ready", self.ready_route)
        r.add_get("/metrics", self.metrics_route)
        r.add_get("/fleet", self.fleet_route)
        r.add_get("/admin/replicas", self.admin_list)
        r.add_post("/admin/replicas", self.admin_add)
        r.add_delete("/admin/replicas/{name}", self.admin_remove)
        r.add_post("/admin/reload", self.admin_reload)
        return bind_lifecycle(app, self.start, self.stop)

    @web.middleware
    async def _errors(self, request: web.Request, handler) -> web.StreamResponse:
        try:
            return await self._answer(request, handler)
        finally:
            held = request.get(HELD, 0)
            if held:  # the body's bytes, counted while it was read
                self.bodies.give(held)
                request[HELD] = 0

    async def _answer(self, request: web.Request, handler) -> web.StreamResponse:
        """Every error the gateway answers is OpenAI-shaped JSON: its own, aiohttp's (404,
        405, 413, ...), and anything unexpected (a 500, logged in one line)."""
        try:
            self._check_head(request)
            return await handler(request)
        except GatewayError as exc:
            resp = exc.response()
            if exc.code == "head_too_large":
                resp.force_close()
            return resp
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            code = "not_found" if exc.status == 404 else exc.reason.lower().replace(" ", "_")
            return GatewayError(exc.status, f"{exc.reason}: {request.method} {request.path}",
                                code).response()  # fmt: skip
        except (asyncio.CancelledError, ClientGone):
            raise
        except Exception as exc:  # one line: what and where, never the request's text
            event(logging.ERROR, "internal_error", path=request.path, **where(exc))
            return GatewayError(
                500, "Internal gateway error (logged).", "internal_error"
            ).response()

    def _check_head(self, request: web.Request) -> None:
        """A head that came whole within one read is measured here (one that did not was cut
        off while it arrived: ``serve.ConnectionLimits``)."""
        limit = self.cfg.server.max_head_bytes
        size = len(request.raw_path) + sum(len(k) + len(v) + 4 for k, v in request.raw_headers)
        if size > limit:
            raise GatewayError(
                431,
                f"The request head is larger than {limit} bytes (server.max_head_bytes).",
                "head_too_large",
            )

    # -- callbacks from the parts ----------------------------------------------------------
    def _on_health(self, rep: Replica, before: str, now: str) -> None:
        if now == UNHEALTHY and before == HEALTHY:
            self.metrics.ejections.labels(rep.name, "health").inc()
            if not self.router.panic:
                rep.abort_all(f"ejected ({rep.name}): health checks failing")

    def _on_failure(self, rep: Replica, why: str) -> None:
        """A failure blamed on ``rep`` (retry.py decides which are)."""
        rep.failed += 1
        self.metrics.blamed.labels(rep.name).inc()
        if rep.breaker.record_failure(time.monotonic()):
            self._ejected(rep, "breaker", why)

    def _on_down(self, rep: Replica, why: str) -> None:
        """``rep`` could not be connected to: no new request goes there until its breaker's
        trial (those in flight there go on: they fail, or finish, by themselves)."""
        if rep.breaker.trip(time.monotonic()):
            self._ejected(rep, "connect", why, abort=False)
        self.health.kick(rep)

    def _on_hung(self, rep: Replica, source: str, why: str) -> None:
        rep.note_error("stalled" if source == "stall" else source, why)
        if rep.breaker.trip(time.monotonic()):
            self._ejected(rep, source, why)
        self.health.kick(rep)

    def _ejected(self, rep: Replica, source: str, why: str, abort: bool = True) -> None:
        self.metrics.ejections.labels(rep.name, source).inc()
        event(logging.WARNING, "replica_ejected", replica=rep.name, source=source, why=why,
              until_s=round(rep.breaker.open_until - time.monotonic(), 3))  # fmt: skip
        if abort:
            rep.abort_all(f"ejected ({rep.name}): {source}")

    def _on_scrape(self, rep: Replica) -> None:
        s = rep.scraped
        if "prefix_cache_hits" in s:
            self.metrics.replica_prefix_hits.labels(rep.name).set(s["prefix_cache_hits"])
        if "prefix_cache_queries" in s:
            self.metrics.replica_prefix_queries.labels(rep.name).set(s["prefix_cache_queries"])

    def _on_removed(self, rep: Replica) -> None:
        self.health.unwatch(rep)
        if self.replicas.get(rep.name) is None:
            self.policy.forget(rep.name)
        self.metrics.forget_replica(rep.name)

    # -- generation routes -----------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, COMPLETIONS, "/v1/completions")

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, CHAT, "/v1/chat/completions")

    async def _generate(self, request: web.Request, kind: str, path: str) -> web.StreamResponse:
        t0 = time.monotonic()
        rid = self._request_id(request)
        m = self.metrics
        status, replica, decision, call = 500, "none", "none", None
        counted = False
        streamer: str | None = None
        try:
            if self.draining:
                raise GatewayError(
                    503, "The gateway is shutting down.", "draining", retry_after=1.0
                )
            auth = header_value(request, "Authorization")
            who = await self.keys.identify(auth, request.headers, request.remote)
            raw = await self._read_body(request)
            self.in_flight += 1
            self._idle.clear()
            counted = True
            parsed = parse_request(kind, load_json(raw))
            if parsed.choices > self.cfg.admission.max_n:
                raise GatewayError(
                    400,
                    f"n (and best_of) may be at most {self.cfg.admission.max_n} here "
                    f"(admission.max_n); this request asks for {parsed.choices}.",
                    "invalid_request",
                    "n",
                )
            max_tokens = parsed.max_tokens or DEFAULT_MAX_TOKENS
            if self.limiter is not None:
                await self._rate_limit(who.user, who.tier, parsed.token_estimate + max_tokens)
            self.router.check_model(parsed.model)
            prompt_tokens = await self._prompt_tokens(parsed)
            if parsed.stream:
                if not self.streams.enter(who.user):
                    raise GatewayError(
                        429,
                        f"{who.user} has {self.streams.cap} streams open already "
                        "(admission.max_streams_per_client).",
                        "too_many_streams",
                        retry_after=1.0,
                    )
                streamer = who.user
            waited = await self.admission.acquire()
            m.queue_time.observe(waited)
            try:
                ctx = RequestContext(
                    rid, prompt_tokens, max_tokens, self._session_key(request, parsed),
                    parsed.prefix_hashes() if self._prefixes else (),
                )  # fmt: skip
                call = Call(request, parsed, ctx, rid, path, raw, t0, waited, auth)
                if parsed.stream:
                    sc = self.cfg.stream
                    keep = sc.max_resume_log_bytes if sc.resume and parsed.resumable else 0
                    call.stream = StreamState(request, sc.write_timeout, keep)
                resp, outcome = await self.forwarder.forward(call)
            finally:
                self.admission.release()
            status = resp.status
            replica, decision = outcome.replica, outcome.decision
            m.decisions_of(self.policy.name, decision).inc()
            if outcome.expected_hit_tokens and replica != "none":
                m.predicted_hit_tokens_of(replica).inc(outcome.expected_hit_tokens)
            if replica != "none":
                m.routed_prompt_tokens_of(replica).inc(prompt_tokens)
            if outcome.ttft is not None:
                m.ttft_of(kind).observe(outcome.ttft)
            return resp
        except GatewayError as exc:
            status = exc.status
            m.rejected.labels(exc.code).inc()
            if call is not None and call.stream is not None and call.stream.open:
                try:
                    return await call.stream.fail(exc.message)
                except ClientGone as gone:
                    status = self._client_gone(call, gone)
                    return call.stream.out  # type: ignore[return-value]
            resp = exc.response({"X-Request-Id": rid})
            if exc.code in ("body_too_large", "gateway_busy"):
                resp.force_close()  # no lingering read of a body refused unread
            return resp
        except (ClientGone, asyncio.CancelledError, ConnectionError) as exc:
            status = self._client_gone(call, exc)
            if call is not None and call.stream is not None and call.stream.out is not None:
                return call.stream.out
            return web.Response(status=499)
        finally:
            e2e = time.monotonic() - t0
            m.requests_of(kind, str(status), replica, decision).inc()
            if status < 400:
                m.e2e_of(kind).observe(e2e)
            if streamer is not None:
                self.streams.leave(streamer)
            if counted:
                self.in_flight -= 1
                if self.in_flight == 0:
                    self._idle.set()
            level = logging.INFO if status < 500 else logging.WARNING
            if log.isEnabledFor(level):
                oc = call.outcome if call is not None else None
                self._log_request(level, rid, kind, status, replica, decision, oc, e2e)

    def _client_gone(self, call: Call | None, exc: BaseException) -> int:
        """Count a client that left (or was closed for not reading); its status, 499."""
        self.metrics.client_disconnects.inc()
        if isinstance(exc, ClientTooSlow):
            self.metrics.slow_clients.inc()
            if call is not None:
                call.outcome.error = str(exc)
        return 499

    def _request_id(self, request: web.Request) -> str:
        """The client's X-Request-Id when it is a sane one (printable ASCII, short), else new."""
        v = request.headers.get("X-Request-Id")
        if v and len(v) <= MAX_REQUEST_ID and v.isascii() and v.isprintable() and " " not in v:
            return v
        return f"{self._rid.getrandbits(128):032x}"

    async def _rate_limit(self, user: str, tier: str, tokens: int) -> None:
        assert self.limiter is not None
        lim = self.tiers.get(tier, self.tiers["default"])
        v = await self.limiter.check(user, tokens, lim)
        if not v.allowed:
            raise GatewayError(
                429,
                f"Rate limit reached for {user} (tier {tier}): too many {v.which}. "
                f"Retry in {v.retry_after:.2f} s.",
                "rate_limit_exceeded",
                retry_after=v.retry_after,
            )

    def body_limit(self) -> int:
        """Bytes a body may have: ``max_body_bytes``, lower while the fleet's max_model_len is
        known (no prompt that fits is longer than max_model_len x max_token_bytes bytes)."""
        a = self.cfg.admission
        limit = self.fleet_max_model_len(None)
        if limit is None:
            return a.max_body_bytes
        return min(a.max_body_bytes, BODY_SLACK + 2 * limit * a.max_token_bytes)

    async def _read_body(self, request: web.Request) -> bytes:
        """The body, refused before it is read when Content-Length is over the limit, cut
        off at the limit otherwise, and within ``server.body_timeout``."""
        limit = self.body_limit()
        too_big = GatewayError(
            413,
            f"The request body is larger than {limit} bytes (admission.max_body_bytes, and "
            "max_model_len x admission.max_token_bytes).",
            "body_too_large",
        )
        if request.content_length is not None and request.content_length > limit:
            raise too_big
        busy = GatewayError(
            503,
            "The gateway holds as many request bodies as it may (server.max_buffered_bytes); "
            "retry later.",
            "gateway_busy",
            retry_after=1.0,
        )
        if request.content_length is not None and not self.bodies.fits(request.content_length):
            raise busy
        body = bytearray()
        try:
            async with asyncio.timeout(self.cfg.server.body_timeout):
                while chunk := await request.content.readany():
                    if not self.bodies.take(len(chunk)):
                        raise busy
                    request[HELD] = request.get(HELD, 0) + len(chunk)
                    body += chunk
                    if len(body) > limit:
                        raise too_big
        except TimeoutError:
            raise GatewayError(
                408,
                f"The request body did not arrive within {self.cfg.server.body_timeout:g} s "
                "(server.body_timeout).",
                "body_timeout",
            ) from None
        except (
            ValueError,
            OSError,
            web.HTTPException,
            HttpProcessingError,
            RequestPayloadError,
        ) as exc:
            if isinstance(exc, ConnectionError):  # the client left
                raise
            raise GatewayError(  # e.g. a body that is not what its Content-Encoding says
                400, f"The request body could not be read: {exc}"[:300], "invalid_body"
            ) from None
        return bytes(body)

    @staticmethod
    def _log_request(
        level: int,
        rid: str,
        kind: str,
        status: int,
        replica: str,
        decision: str,
        outcome,
        e2e: float,
    ) -> None:
        event(
            level,
            "request",
            request_id=rid,
            route=kind,
            status=status,
            replica=replica,
            decision=decision,
            attempts=outcome.attempts if outcome else 0,
            resumes=outcome.resumes if outcome else 0,
            ttft_s=round(outcome.ttft, 6) if outcome and outcome.ttft is not None else None,
            e2e_s=round(e2e, 6),
            error=outcome.error if outcome else None,
        )

    @staticmethod
    def _session_key(request: web.Request, parsed: ParsedRequest) -> str | None:
        """Where a conversation lives (routing only: a client may choose its replica within
        the load bound, never its rate-limit bucket)."""
        h = request.headers
        return h.get("X-Session-ID") or h.get("X-User-ID") or parsed.req.user

    # -- context length --------------------------------------------------------------------
    def fleet_max_model_len(self, model: str | None) -> int | None:
        if self.cfg.admission.max_model_len is not None:
            return self.cfg.admission.max_model_len
        lens = [
            r.max_model_len
            for r in self.router.serving(model)
            if r.health == HEALTHY and r.max_model_len is not None
        ]
        return min(lens) if lens else None

    async def _prompt_tokens(self, parsed: ParsedRequest) -> int:
        """The prompt's tokens for load bookkeeping, its longest prompt checked against the
        fleet's max_model_len first (400 if too long, never forwarded). Bounds first: UTF-8
        bytes is an upper bound for any tokenizer, bytes / ``max_token_bytes`` a lower one;
        only between the two is a replica's /tokenize asked (``admission.token_count``)."""
        limit = self.fleet_max_model_len(parsed.model)
        if limit is None:
            return parsed.token_estimate
        out = parsed.max_tokens or 0
        if parsed.longest_ids is not None:
            n, exact = parsed.longest_ids, True
        else:
            upper = parsed.longest_bytes
            if upper + out <= limit and upper < limit:
                return parsed.token_estimate  # fits whatever the tokenizer
            n = math.ceil(upper / self.cfg.admission.max_token_bytes)
            exact = False
            if n + out <= limit and n < limit:  # the bounds cannot tell: count
                counted = None
                if self.cfg.admission.token_count == "tokenize":
                    counted = await self._tokenize(parsed)
                n, exact = (counted, True) if counted is not None else (n, False)
        if n + out > limit or n >= limit:
            what = "messages" if parsed.kind == CHAT else "prompt"
            least = "" if exact else "at least "
            raise GatewayError(
                400,
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{least}{n + out} tokens ({least}{n} in the {what}, {out} in the completion). "
                f"Please reduce the length of the {what} or completion.",
                "context_length_exceeded",
                what,
            )
        return max(n, parsed.token_estimate) if parsed.longest_ids is None else n

    async def _tokenize(self, parsed: ParsedRequest) -> int | None:
        now = time.monotonic()
        reps = [r for r in self.router.serving(parsed.model) if r.routable(now)]
        body = parsed.tokenize_body()
        if not reps or body is None:
            return None
        self._tok_rr += 1
        return await tokenize_count(reps[self._tok_rr % len(reps)], body, TOKENIZE_TIMEOUT)

    # -- other routes ----------------------------------------------------------------------
    async def _identify(self, request: web.Request, route: str):
        """Who sends a request to ``route`` (401 when ``auth.required`` and no known key),
        or None for a route in ``auth.open_routes``."""
        if route in self.cfg.auth.open_routes:
            return None
        auth = header_value(request, "Authorization")
        return await self.keys.identify(auth, request.headers, request.remote)

    async def tokenize_route(self, request: web.Request) -> web.StreamResponse:
        """``/tokenize`` and ``/detokenize`` (vLLM's): answered by a ready replica serving the
        body's model, so clients (the bench) size prompts with the fleet's own tokenizer.
        Behind the same identity, rate limits and admission as generation (a request, and
        its body's bytes / 4 as tokens), unless ``auth.open_routes`` lists it."""
        if self.draining:
            raise GatewayError(503, "The gateway is shutting down.", "draining", retry_after=1.0)
        who = await self._identify(request, request.path)
        raw = await self._read_body(request)
        body = load_json(raw)
        if not isinstance(body, dict):
            raise GatewayError(400, "The body must be a JSON object.", "invalid_json")
        if who is not None and self.limiter is not None:
            await self._rate_limit(who.user, who.tier, len(raw) // 4 + 1)
        model = body.get("model") if isinstance(body.get("model"), str) else None
        self.router.check_model(model)
        now = time.monotonic()
        reps = [r for r in self.router.serving(model) if r.routable(now)]
        if not reps:
            raise GatewayError(
                503, "No replica is ready to tokenize.", "no_replica", retry_after=1.0
            )
        self._tok_rr += 1
        rep = reps[self._tok_rr % len(reps)]
        await self.admission.acquire()
        try:
            reply = await rep.fetch("POST", request.path, body, TOKENIZE_TIMEOUT, "tokenize")
        except (OSError, TimeoutError) as e:
            raise GatewayError(
                502, f"Replica {rep.name} did not answer: {type(e).__name__}.", "upstream_error"
            ) from None
        finally:
            self.admission.release()
        return web.Response(
            body=reply.body,
            status=reply.status,
            content_type="application/json",
            headers={"X-Servefleet-Replica": rep.name},
        )

    async def models(self, request: web.Request) -> web.StreamResponse:
        who = await self._identify(request, "/v1/models")
        if who is not None and self.limiter is not None:
            await self._rate_limit(who.user, who.tier, 1)
        seen: dict[str, dict] = {}
        for r in self.replicas.active():
            if r.health == HEALTHY:
                for m in r.models:
                    seen.setdefault(m["id"], m)
        return web.json_response({"object": "list", "data": list(seen.values())})

    async def health_route(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"status": "ok"})

    async def ready_route(self, request: web.Request) -> web.StreamResponse:
        """200 while the gateway can serve: a replica of every pool takes traffic (the others
        may still be loading: ``missing`` names them), it is not draining, and its rate
        limiter works (with ``on_redis_error: local`` a Redis outage is reported here but does
        not make the gateway unready)."""
        now = time.monotonic()
        ready, missing, pools = [], [], {}
        for r in self.replicas.active():
            pool = pools.setdefault(r.view.pool, {"ready": [], "missing": []})
            which = "ready" if r.routable(now) else "missing"
            pool[which].append(r.name)
            (ready if which == "ready" else missing).append(r.name)
        ok = bool(ready) and all(p["ready"] for p in pools.values()) and not self.draining
        body: dict = {
            "ready": ok,
            "ready_replicas": ready,
            "missing": missing,
            "pools": pools,
            "draining": self.draining,
        }
        if self.limiter is not None:
            rl = self.limiter.status()
            body["rate_limit"] = rl
            if rl.get("backend") == "none":
                ok = body["ready"] = False
        return web.json_response(body, status=200 if ok else 503)

    def _check_ops(self, request: web.Request) -> None:
        """/fleet and /metrics tell replica URLs and errors: with an admin token set, only to
        whoever gives it, whatever the bind address (a proxy on the same host connects from
        loopback too); without one, only while listening on loopback."""
        if self.cfg.admin_token is None:
            if self.ops_open:
                return
            raise GatewayError(
                403,
                "The gateway listens beyond loopback: set admin_token to read /fleet and "
                "/metrics (Authorization: Bearer <token>).",
                "forbidden",
            )
        self._check_token(request, self.cfg.admin_token)

    @staticmethod
    def _check_token(request: web.Request, token: str) -> None:
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(errors="replace"), f"Bearer {token}".encode()):
            raise GatewayError(401, "Give `Authorization: Bearer <admin token>`.", "unauthorized")

    async def metrics_route(self, request: web.Request) -> web.StreamResponse:
        self._check_ops(request)
        m = self.metrics
        now = time.monotonic()
        for r in self.replicas.active():
            r.routable(now)  # moves open breakers to half-open when due
            m.replica_in_flight.labels(r.name).set(r.view.in_flight)
            m.breaker_state.labels(r.name).set(STATE_VALUE[r.breaker.state])
            m.replica_ready.labels(r.name).set(1 if r.routable(now) else 0)
        return web.Response(body=m.render(), headers={"Content-Type": "text/plain; version=0.0.4"})

    async def fleet_route(self, request: web.Request) -> web.StreamResponse:
        self._check_ops(request)
        now = time.monotonic()
        reps = []
        for r in self.replicas:
            r.routable(now)
            reps.append(r.describe())
        return web.json_response(
            {
                "policy": self.policy.name,
                "draining": self.draining,
                "in_flight": self.in_flight,
                "admission": {
                    "active": self.admission.active,
                    "queued": self.admission.queued,
                    "max_concurrency": self.admission.max_concurrency,
                    "max_queue": self.admission.max_queue,
                    "body_bytes_held": self.bodies.held,
                },
                "max_model_len": self.fleet_max_model_len(None),
                "rate_limit": self.limiter.status() if self.limiter is not None else None,
                "replicas": reps,
            }
        )

    # -- admin -----------------------------------------------------------------------------
    def _check_admin(self, request: web.Request) -> None:
        token = self.cfg.admin_token
        if token is None:
            raise GatewayError(404, "Admin endpoints are off: set admin_token.", "admin_disabled")
        self._check_token(request, token)

    async def _admin(self, request: web.Request, fn) -> web.StreamResponse:
        self._check_admin(request)
        return web.json_response(await fn())

    async def admin_list(self, request: web.Request) -> web.StreamResponse:
        async def fn():
            return {"replicas": [r.describe() for r in self.replicas]}

        return await self._admin(request, fn)

    async def admin_add(self, request: web.Request) -> web.StreamResponse:
        async def fn():
            try:
                rc = ReplicaConfig.model_validate(load_json(await self._read_body(request)))
                rep = await self.replicas.add(rc)
            except ValidationError as exc:
                raise GatewayError(
                    400, f"bad replica: {exc.errors(include_url=False)}", "invalid_replica"
                ) from None
            except ValueError as exc:
                raise GatewayError(409, str(exc), "replica_exists") from None
            return {"added": rep.name}

        return await self._admin(request, fn)

    async def admin_remove(self, request: web.Request) -> web.StreamResponse:
        async def fn():
            name = request.match_info["name"]
            try:
                rep = self.replicas.remove(name)
            except KeyError:
                raise GatewayError(
                    404, f"No replica named {name!r}.", "replica_not_found"
                ) from None
            return {"draining": rep.name, "in_flight": rep.view.in_flight}

        return await self._admin(request, fn)

    async def admin_reload(self, request: web.Request) -> web.StreamResponse:
        async def fn():
            return await self.reload()

        return await self._admin(request, fn)

    async def reload(self) -> dict:
        """Re-read the config file and apply its replica list (other settings need a
        restart)."""
        if self.config_path is None:
            raise GatewayError(400, "The gateway was started without --config.", "no_config")
        try:
            cfg = self.loader(self.config_path)
        except ConfigError as exc:
            raise GatewayError(400, str(exc), "invalid_config") from None
        try:
            changes = await self.replicas.apply([*cfg.replicas, *discovered(self.discovery)])
        except ValueError as exc:
            raise GatewayError(400, str(exc), "invalid_config") from None
        self.cfg.replicas = cfg.replicas
        event(logging.INFO, "config_reloaded", **changes)
        return changes
