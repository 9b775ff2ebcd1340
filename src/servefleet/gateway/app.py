"""The gateway: an OpenAI-compatible HTTP front for a fleet of vLLM replicas.

``Gateway`` wires the parts, each in its own module and with its own ``start``/``stop``:
replicas and their connection pools (``replica``), active health checks (``health``), the
scraper of the replicas' metrics (``scrape``), admission and rate limits (``admission``,
``ratelimit``), forwarding (``proxy``), metrics (``metrics``). The routing policy comes from
``servefleet.routing`` and is the only place where a replica is chosen.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models``,
``GET /health``, ``GET /ready``, ``GET /metrics``, ``GET /fleet``; with an admin token,
``GET|POST /admin/replicas``, ``DELETE /admin/replicas/{name}``, ``POST /admin/reload``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import time
from pathlib import Path

from aiohttp import web
from pydantic import ValidationError

from servefleet.aiohttp_util import bind_lifecycle
from servefleet.gateway.admission import Admission
from servefleet.gateway.breaker import STATE_VALUE
from servefleet.gateway.config import ConfigError, GatewayConfig, ReplicaConfig, load_config
from servefleet.gateway.discovery import discovered, start_discovery
from servefleet.gateway.errors import GatewayError
from servefleet.gateway.health import HealthChecker
from servefleet.gateway.log import event, log
from servefleet.gateway.metrics import GatewayMetrics
from servefleet.gateway.parse import CHAT, COMPLETIONS, ParsedRequest, load_json, parse_request
from servefleet.gateway.proxy import ClientGone, Forwarder
from servefleet.gateway.ratelimit import make_limiter
from servefleet.gateway.replica import HEALTHY, UNHEALTHY, Replica, ReplicaSet
from servefleet.gateway.router import Router
from servefleet.gateway.scrape import MetricsScraper
from servefleet.routing import (
    ConsistentHash,
    LeastOutstanding,
    LengthPools,
    PowerOfTwo,
    RequestContext,
    RoundRobin,
    make_policy,
)

DEFAULT_MAX_TOKENS = 256
"""Output tokens assumed for load bookkeeping when a request sets no max_tokens."""
TOKENIZE_TIMEOUT = 2.0
_NO_PREFIXES = (ConsistentHash, LeastOutstanding, PowerOfTwo, RoundRobin)
"""Policies that never read ``RequestContext.prefix_hashes``."""


def uses_prefixes(policy) -> bool:
    """Whether ``policy`` reads the prompt's prefix hashes (True for any policy not known to
    ignore them): computing them costs a hash per 256 prompt characters per request."""
    if isinstance(policy, LengthPools):
        return uses_prefixes(policy.long_policy) or uses_prefixes(policy.default_policy)
    return not isinstance(policy, _NO_PREFIXES)


class Gateway:
    def __init__(self, cfg: GatewayConfig, config_path: Path | None = None) -> None:
        self.cfg = cfg
        self.config_path = config_path
        self.metrics = GatewayMetrics()
        self.policy = make_policy(cfg.policy.name, **cfg.policy.options)
        self.replicas = ReplicaSet(cfg)
        self.router = Router(self.replicas, self.policy, cfg.health.panic_threshold)
        self.health = HealthChecker(self.replicas, cfg.health, self._on_health)
        self.scraper = MetricsScraper(self.replicas, cfg.scrape_interval, self._on_scrape)
        a = cfg.admission
        self.admission = Admission(a.max_concurrency, a.max_queue, a.max_queue_wait)
        self.limiter = make_limiter(cfg.rate_limit)
        self.forwarder = Forwarder(cfg, self.router, self.metrics, self._on_failure)
        self.draining = False
        self.in_flight = 0
        self._prefixes = uses_prefixes(self.policy)
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
        ping = getattr(self.limiter, "ping", None)
        if ping is not None:
            await ping()

    async def drain(self, timeout: float) -> bool:
        """Stop taking requests; wait up to ``timeout`` s for those in flight. True if all
        finished."""
        self.draining = True
        event(logging.INFO, "draining", in_flight=self.in_flight, timeout_s=timeout)
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except TimeoutError:
            return False

    async def stop(self) -> None:
        self.draining = True
        if self.discovery is not None:
            await self.discovery.stop()
        await self.scraper.stop()
        await self.health.stop()
        await self.replicas.close(0.0)
        if self.limiter is not None:
            await self.limiter.close()

    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=self.cfg.admission.max_body_bytes)
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

    # -- callbacks from the parts ----------------------------------------------------------
    def _on_health(self, rep: Replica, before: str, now: str) -> None:
        if now == UNHEALTHY and before == HEALTHY:
            self.metrics.ejections.labels(rep.name, "health").inc()

    def _on_failure(self, rep: Replica, why: str) -> None:
        rep.failed += 1
        if rep.breaker.record_failure(time.monotonic()):
            self.metrics.ejections.labels(rep.name, "breaker").inc()
            event(logging.WARNING, "replica_ejected", replica=rep.name, source="breaker", why=why,
                  until_s=round(rep.breaker.open_until - time.monotonic(), 3))  # fmt: skip
        self.health.kick(rep)

    def _on_scrape(self, rep: Replica) -> None:
        s = rep.scraped
        if "prefix_cache_hits" in s:
            self.metrics.replica_prefix_hits.labels(rep.name).set(s["prefix_cache_hits"])
        if "prefix_cache_queries" in s:
            self.metrics.replica_prefix_queries.labels(rep.name).set(s["prefix_cache_queries"])

    def _on_removed(self, rep: Replica) -> None:
        self.health.unwatch(rep)
        forget = getattr(getattr(self.policy, "index", None), "forget", None)
        if forget is not None and self.replicas.get(rep.name) is None:
            forget(rep.name)
        self.metrics.forget_replica(rep.name)

    # -- generation routes -----------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, COMPLETIONS, "/v1/completions")

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, CHAT, "/v1/chat/completions")

    async def _generate(self, request: web.Request, kind: str, path: str) -> web.StreamResponse:
        t0 = time.monotonic()
        rid = request.headers.get("X-Request-Id") or f"{self._rid.getrandbits(128):032x}"
        m = self.metrics
        self.in_flight += 1
        self._idle.clear()
        status, replica, decision, outcome = 500, "none", "none", None
        try:
            if self.draining:
                raise GatewayError(
                    503, "The gateway is shutting down.", "draining", retry_after=1.0
                )
            parsed, raw = await self._read(request, kind)
            user = self._user(request, parsed)
            prompt_tokens = parsed.token_estimate
            max_tokens = parsed.max_tokens or DEFAULT_MAX_TOKENS
            if self.limiter is not None:
                v = await self.limiter.check(user, prompt_tokens + max_tokens)
                if not v.allowed:
                    raise GatewayError(
                        429,
                        f"Rate limit reached for user {user!r}: too many {v.which} "
                        f"({self._limits_text()}). Retry in {v.retry_after:.2f} s.",
                        "rate_limit_exceeded",
                        retry_after=v.retry_after,
                    )
            self.router.check_model(parsed.model)
            prompt_tokens = await self._prompt_tokens(parsed)
            waited = await self.admission.acquire()
            m.queue_time.observe(waited)
            try:
                ctx = RequestContext(
                    rid, prompt_tokens, max_tokens, self._session_key(request, parsed),
                    parsed.prefix_hashes() if self._prefixes else (),
                )  # fmt: skip
                resp, outcome = await self.forwarder.forward(
                    request, parsed, ctx, raw, path, rid, t0, waited
                )
            finally:
                self.admission.release()
            status = resp.status
            replica, decision = outcome.replica, outcome.decision
            m.decisions_of(self.policy.name, decision).inc()
            if outcome.expected_hit_tokens and replica != "none":
                m.predicted_hit_tokens_of(replica).inc(outcome.expected_hit_tokens)
            if outcome.ttft is not None:
                m.ttft_of(kind).observe(outcome.ttft)
            return resp
        except GatewayError as exc:
            status = exc.status
            m.rejected.labels(exc.code).inc()
            return exc.response({"X-Request-Id": rid})
        except web.HTTPRequestEntityTooLarge:
            status = 413
            m.rejected.labels("body_too_large").inc()
            return GatewayError(
                413,
                f"The request body is larger than {self.cfg.admission.max_body_bytes} bytes "
                "(admission.max_body_bytes).",
                "body_too_large",
            ).response({"X-Request-Id": rid})
        except (ClientGone, asyncio.CancelledError):
            status = 499
            m.client_disconnects.inc()
            raise
        finally:
            e2e = time.monotonic() - t0
            m.requests_of(kind, str(status), replica, decision).inc()
            if status < 400:
                m.e2e_of(kind).observe(e2e)
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle.set()
            level = logging.INFO if status < 500 else logging.WARNING
            if log.isEnabledFor(level):
                self._log_request(level, rid, kind, status, replica, decision, outcome, e2e)

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

    async def _read(self, request: web.Request, kind: str) -> tuple[ParsedRequest, bytes]:
        limit = self.cfg.admission.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=request.content_length)
        raw = await request.read()
        return parse_request(kind, load_json(raw)), raw

    @staticmethod
    def _session_key(request: web.Request, parsed: ParsedRequest) -> str | None:
        h = request.headers
        return h.get("X-Session-ID") or h.get("X-User-ID") or parsed.user

    @staticmethod
    def _user(request: web.Request, parsed: ParsedRequest) -> str:
        h = request.headers
        user = h.get("X-User-ID") or parsed.user
        if user:
            return user
        auth = h.get("Authorization")
        if auth:
            return "key:" + hashlib.blake2b(auth.encode(), digest_size=8).hexdigest()
        return "ip:" + (request.remote or "unknown")

    def _limits_text(self) -> str:
        c = self.cfg.rate_limit
        parts = []
        if c.requests_per_second:
            parts.append(f"{c.requests_per_second:g} requests/s")
        if c.tokens_per_minute:
            parts.append(f"{c.tokens_per_minute:g} tokens/min")
        return ", ".join(parts)

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
        """The prompt's tokens, checked against the fleet's max_model_len (400 if too long,
        never forwarded). Exact when a replica's /tokenize was asked (see the config's
        ``admission.token_count``), an estimate otherwise."""
        limit = self.fleet_max_model_len(parsed.model)
        if limit is None:
            return parsed.token_estimate
        out = parsed.max_tokens or 0
        if parsed.prompt_ids is not None:
            n = len(parsed.prompt_ids)
        elif parsed.token_upper_bound + out <= limit and parsed.token_upper_bound < limit:
            return parsed.token_estimate  # fits whatever the tokenizer
        elif self.cfg.admission.token_count == "tokenize":
            n = await self._tokenize(parsed)
            if n is None:
                n = parsed.token_estimate
        else:
            n = parsed.token_estimate
        if n + out > limit or n >= limit:
            what = "messages" if parsed.kind == CHAT else "prompt"
            raise GatewayError(
                400,
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{n + out} tokens ({n} in the {what}, {out} in the completion). Please reduce "
                f"the length of the {what} or completion.",
                "context_length_exceeded",
                what,
            )
        return n

    async def _tokenize(self, parsed: ParsedRequest) -> int | None:
        now = time.monotonic()
        reps = [r for r in self.router.serving(parsed.model) if r.routable(now)]
        if not reps:
            return None
        self._tok_rr += 1
        rep = reps[self._tok_rr % len(reps)]
        if parsed.kind == CHAT:
            body = {"messages": parsed.body["messages"], "add_generation_prompt": True}
        elif isinstance(parsed.body.get("prompt"), str):
            body = {"prompt": parsed.body["prompt"]}
        else:
            return None
        if parsed.model:
            body["model"] = parsed.model
        import aiohttp

        try:
            assert rep.session is not None
            async with rep.session.post(
                rep.url + "/tokenize",
                json=body,
                headers=rep.upstream_headers("tokenize", None),
                timeout=aiohttp.ClientTimeout(total=TOKENIZE_TIMEOUT),
            ) as resp:
                if resp.status != 200:
                    return None
                count = (await resp.json()).get("count")
                return count if isinstance(count, int) else None
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError, AssertionError):
            return None

    # -- other routes ----------------------------------------------------------------------
    async def tokenize_route(self, request: web.Request) -> web.StreamResponse:
        """``/tokenize`` and ``/detokenize`` (vLLM's): answered by a ready replica serving the
        body's model, so clients (the bench) size prompts with the fleet's own tokenizer."""
        import aiohttp

        try:
            try:
                body = await request.json()
            except ValueError:
                raise GatewayError(400, "The body is not valid JSON.", "invalid_json") from None
            if not isinstance(body, dict):
                raise GatewayError(400, "The body must be a JSON object.", "invalid_json")
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
            assert rep.session is not None
            try:
                async with rep.session.post(
                    rep.url + request.path,
                    json=body,
                    headers=rep.upstream_headers(
                        request.headers.get("X-Request-Id", "tokenize"),
                        request.headers.get("Authorization"),
                    ),
                    timeout=aiohttp.ClientTimeout(total=TOKENIZE_TIMEOUT),
                ) as resp:
                    data = await resp.read()
                    return web.Response(
                        body=data,
                        status=resp.status,
                        content_type="application/json",
                        headers={"X-Servefleet-Replica": rep.name},
                    )
            except (aiohttp.ClientError, TimeoutError, OSError) as e:
                raise GatewayError(
                    502, f"Replica {rep.name} did not answer: {type(e).__name__}.", "upstream_error"
                ) from None
        except GatewayError as exc:
            return exc.response()

    async def models(self, request: web.Request) -> web.StreamResponse:
        seen: dict[str, dict] = {}
        for r in self.replicas.active():
            if r.health == HEALTHY:
                for m in r.models:
                    seen.setdefault(m["id"], m)
        return web.json_response({"object": "list", "data": list(seen.values())})

    async def health_route(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"status": "ok"})

    async def ready_route(self, request: web.Request) -> web.StreamResponse:
        now = time.monotonic()
        ready = [r.name for r in self.replicas.active() if r.routable(now)]
        ok = bool(ready) and not self.draining
        body = {"ready": ok, "ready_replicas": ready, "draining": self.draining}
        return web.json_response(body, status=200 if ok else 503)

    async def metrics_route(self, request: web.Request) -> web.StreamResponse:
        m = self.metrics
        now = time.monotonic()
        for r in self.replicas.active():
            r.routable(now)  # moves open breakers to half-open when due
            m.replica_in_flight.labels(r.name).set(r.view.in_flight)
            m.breaker_state.labels(r.name).set(STATE_VALUE[r.breaker.state])
            m.replica_ready.labels(r.name).set(1 if r.routable(now) else 0)
        return web.Response(body=m.render(), headers={"Content-Type": "text/plain; version=0.0.4"})

    async def fleet_route(self, request: web.Request) -> web.StreamResponse:
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
                },
                "max_model_len": self.fleet_max_model_len(None),
                "replicas": reps,
            }
        )

    # -- admin -----------------------------------------------------------------------------
    def _check_admin(self, request: web.Request) -> None:
        token = self.cfg.admin_token
        if token is None:
            raise GatewayError(404, "Admin endpoints are off: set admin_token.", "admin_disabled")
        if request.headers.get("Authorization") != f"Bearer {token}":
            raise GatewayError(401, "Give `Authorization: Bearer <admin token>`.", "unauthorized")

    async def _admin(self, request: web.Request, fn) -> web.StreamResponse:
        try:
            self._check_admin(request)
            return web.json_response(await fn())
        except GatewayError as exc:
            return exc.response()

    async def admin_list(self, request: web.Request) -> web.StreamResponse:
        async def fn():
            return {"replicas": [r.describe() for r in self.replicas]}

        return await self._admin(request, fn)

    async def admin_add(self, request: web.Request) -> web.StreamResponse:
        async def fn():
            try:
                rc = ReplicaConfig.model_validate(load_json(await request.read()))
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
            cfg = load_config(self.config_path)
        except ConfigError as exc:
            raise GatewayError(400, str(exc), "invalid_config") from None
        try:
            changes = await self.replicas.apply([*cfg.replicas, *discovered(self.discovery)])
        except ValueError as exc:
            raise GatewayError(400, str(exc), "invalid_config") from None
        self.cfg.replicas = cfg.replicas
        event(logging.INFO, "config_reloaded", **changes)
        return changes
