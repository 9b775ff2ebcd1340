"""The gateway's view of its replicas: connection pool, health, breaker, load; and the set of
replicas, which changes at run time without dropping requests in flight."""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from servefleet.gateway.breaker import CircuitBreaker
from servefleet.gateway.config import GatewayConfig, ReplicaConfig
from servefleet.gateway.log import event
from servefleet.gateway.upstream import Reply, UpstreamPool
from servefleet.routing import ReplicaView, cost_model_for

STARTING, HEALTHY, UNHEALTHY = "starting", "healthy", "unhealthy"
RECENT_ERRORS = 20
ITL_EWMA = 0.05
TTFT_EWMA = 0.1
"""Weight of each new time to first token in the replica's estimates."""
"""Weight of each new gap between two events of a stream in the replica's ITL estimate."""


class Abortable(Protocol):
    waiting_since: float | None
    """Loop time since which a stream waits for its first event (None: not waiting)."""
    first_deadline: float
    """Seconds it may wait so while its replica sends nothing to any stream."""

    def abort(self, why: str) -> None: ...


class Replica:
    """One upstream server. Its ``view`` is what routing policies see; the gateway keeps the
    view's load fields current (``begin``/``first_token``/``end``) and sets ``ready`` from
    health, breaker and drain state just before each routing decision."""

    def __init__(self, cfg: ReplicaConfig, gw: GatewayConfig) -> None:
        self.cfg = cfg
        self.name = cfg.key
        self.url = cfg.url
        cost = None
        if cfg.model and cfg.gpu:
            try:
                cost = cost_model_for(cfg.model, cfg.gpu, cfg.tp)
            except (ValueError, KeyError, FileNotFoundError) as exc:
                raise ValueError(f"replica {self.name}: model/gpu/tp: {exc}") from None
        self.view = ReplicaView(
            self.name,
            cfg.pool,
            ready=False,
            max_in_flight=cfg.max_in_flight,
            cost=cost,
        )
        if cfg.max_num_batched_tokens:
            self.view.max_num_batched_tokens = cfg.max_num_batched_tokens
        if cfg.max_num_seqs:
            self.view.max_num_seqs = cfg.max_num_seqs
        b = gw.breaker
        self.breaker = CircuitBreaker(b.consecutive_failures, b.base_ejection, b.max_ejection)
        self.health = STARTING
        self.successes = 0
        self.failures = 0
        self.draining = False
        self.model_ids: set[str] = set()
        self.models: list[dict] = []
        self.max_model_len: int | None = None
        self.errors: deque[dict] = deque(maxlen=RECENT_ERRORS)
        self.scraped: dict[str, float] = {}
        self.requests = 0
        self.failed = 0
        self.pool = UpstreamPool(
            cfg.url, gw.stream.connect_timeout, cfg.tls_verify, gw.stream.keepalive_timeout
        )
        """The replica's connections: every request to it goes through this pool."""
        self.closed = False
        self.attempts: set[Abortable] = set()
        """Attempts in flight here: aborted (and so retried or resumed elsewhere) when the
        replica is ejected."""
        self.streaming = 0
        """Attempts here whose stream has begun (the replica owes them tokens)."""
        self.progress_at = 0.0
        """Monotonic time of the last event any stream got from this replica."""
        self.itl = 0.0
        """Typical seconds between two events of one stream here (EWMA; 0: not known)."""
        self.ttft = 0.0
        """Typical seconds from sending a stream to its first event here (EWMA; 0: not known)."""
        self.ttft_per_token = 0.0
        """The same per prompt token (EWMA): what a long prompt may take."""
        self.idle = asyncio.Event()
        self.idle.set()
        self._auth = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
        self._forward = gw.auth.forward_client_key

    # -- connections -----------------------------------------------------------------------
    async def close(self) -> None:
        self.closed = True
        self.pool.close()

    async def fetch(
        self, method: str, path: str, body: Any = None, timeout: float = 2.0, rid: str = "gateway"
    ) -> Reply:
        """The gateway's own request to the replica (``body``: a JSON value, or None)."""
        raw = b"" if body is None else json.dumps(body).encode()
        headers = self.upstream_headers(rid, None) if raw else dict(self._auth)
        return await self.pool.fetch(method, path, raw, headers, timeout)

    def abort_all(self, why: str) -> int:
        """Abort every attempt in flight here; how many."""
        doomed = list(self.attempts)
        for a in doomed:
            a.abort(why)
        return len(doomed)

    def note_progress(self, now: float, gap: float | None) -> None:
        """A stream got an event (``gap`` s after its previous one, None for its first)."""
        self.progress_at = now
        if gap is not None:
            self.itl = gap if self.itl == 0.0 else self.itl + ITL_EWMA * (gap - self.itl)

    def learn_ttft(self, seconds: float, prompt_tokens: int) -> None:
        """A stream sent here got its first event after ``seconds``."""
        self.ttft = seconds if self.ttft == 0.0 else self.ttft + TTFT_EWMA * (seconds - self.ttft)
        if prompt_tokens > 0:
            per = seconds / prompt_tokens
            t = self.ttft_per_token
            self.ttft_per_token = per if t == 0.0 else t + TTFT_EWMA * (per - t)

    def expected_ttft(self, prompt_tokens: int) -> float:
        """What a stream of ``prompt_tokens`` usually waits here for its first event (0: not
        known yet)."""
        return max(self.ttft, self.ttft_per_token * prompt_tokens)

    def upstream_headers(self, request_id: str, client_auth: str | None) -> dict[str, str]:
        h = {"Content-Type": "application/json", "X-Request-Id": request_id}
        if self._auth:
            h.update(self._auth)
        elif client_auth and self._forward:
            h["Authorization"] = client_auth
        return h

    # -- state -----------------------------------------------------------------------------
    def routable(self, now: float, panic: bool = False) -> bool:
        """May get a request now. In ``panic`` (too few healthy replicas), a replica that
        failed its active checks after having been ready counts too (Envoy's panic threshold:
        an overloaded fleet whose health checks time out is not switched off as a whole)."""
        ok = self.health == HEALTHY or (panic and self.health == UNHEALTHY)
        return ok and not self.draining and self.breaker.allows(now)

    @property
    def state(self) -> str:
        if self.draining:
            return "draining"
        if self.health != HEALTHY:
            return self.health
        return {"closed": "ready", "half_open": "half_open", "open": "ejected"}[self.breaker.state]

    def note_error(self, kind: str, detail: str) -> None:
        self.errors.append({"ts": round(time.time(), 3), "kind": kind, "detail": detail[:200]})

    # -- load bookkeeping (what the policies see) ------------------------------------------
    def begin(self, prompt_tokens: int, max_tokens: int) -> None:
        v = self.view
        v.in_flight += 1
        v.in_flight_tokens += prompt_tokens + max_tokens
        v.pending_prefills += 1
        v.pending_prefill_tokens += prompt_tokens
        self.requests += 1
        self.idle.clear()
        self.breaker.on_sent()

    def first_token(self, prompt_tokens: int) -> None:
        v = self.view
        v.pending_prefills -= 1
        v.pending_prefill_tokens -= prompt_tokens

    def end(self, prompt_tokens: int, max_tokens: int, got_first_token: bool) -> None:
        v = self.view
        v.in_flight -= 1
        v.in_flight_tokens -= prompt_tokens + max_tokens
        if not got_first_token:
            self.first_token(prompt_tokens)
        if v.in_flight == 0:
            self.idle.set()

    def learn_latency(self, predicted_unscaled: float, actual: float) -> None:
        """Calibrate ``view.latency_scale`` (observed ÷ predicted TTFT, EWMA)."""
        if predicted_unscaled <= 0 or actual <= 0:
            return
        ratio = min(100.0, max(0.01, actual / predicted_unscaled))
        self.view.latency_scale = 0.8 * self.view.latency_scale + 0.2 * ratio

    def describe(self) -> dict:
        v = self.view
        return {
            "name": self.name,
            "url": self.url,
            "pool": v.pool,
            "state": self.state,
            "health": self.health,
            "breaker": self.breaker.state,
            "in_flight": v.in_flight,
            "in_flight_tokens": v.in_flight_tokens,
            "pending_prefills": v.pending_prefills,
            "max_in_flight": v.max_in_flight,
            "latency_scale": round(v.latency_scale, 4),
            "models": sorted(self.model_ids),
            "max_model_len": self.max_model_len,
            "requests": self.requests,
            "failed": self.failed,
            "scraped": self.scraped,
            "streaming": self.streaming,
            "itl_s": round(self.itl, 6),
            "stale_retries": self.pool.stale_retries,
            "ttft_s": round(self.ttft, 6),
            "recent_errors": list(self.errors),
            # what the replica runs, as configured (the bench's report header shows it)
            "model": self.cfg.model,
            "gpu": self.cfg.gpu,
            "tp": self.cfg.tp,
            "max_num_seqs": self.cfg.max_num_seqs,
            "max_num_batched_tokens": self.cfg.max_num_batched_tokens,
        }


class ReplicaSet:
    """The replicas by name. Removing one drains it: it takes no new request, and is closed
    and forgotten once its requests in flight have finished."""

    def __init__(self, gw: GatewayConfig) -> None:
        self.gw = gw
        self._replicas: dict[str, Replica] = {}
        self.changed = asyncio.Event()
        """Set whenever capacity may have appeared (a request ended, a replica got ready)."""
        self._drains: set[asyncio.Task] = set()
        self.on_added: list[Callable[[Replica], None]] = []
        self.on_removed: list[Callable[[Replica], None]] = []

    def __iter__(self) -> Iterator[Replica]:
        return iter(list(self._replicas.values()))

    def __len__(self) -> int:
        return len(self._replicas)

    def get(self, name: str) -> Replica | None:
        return self._replicas.get(name)

    def active(self) -> list[Replica]:
        return [r for r in self._replicas.values() if not r.draining]

    def notify(self) -> None:
        self.changed.set()

    async def add(self, cfg: ReplicaConfig) -> Replica:
        old = self._replicas.get(cfg.key)
        if old is not None and not old.draining:
            raise ValueError(f"replica {cfg.key!r} exists already")
        if old is not None:  # re-added while draining: let the old one finish under a new key
            self._replicas.pop(cfg.key)
            self._replicas[f"{cfg.key}~draining~{id(old)}"] = old
        rep = Replica(cfg, self.gw)
        self._replicas[rep.name] = rep
        event(20, "replica_added", replica=rep.name, url=rep.url, pool=rep.view.pool)
        for cb in self.on_added:
            cb(rep)
        return rep

    def remove(self, name: str) -> Replica:
        rep = self._replicas.get(name)
        if rep is None or rep.draining:
            raise KeyError(name)
        rep.draining = True
        rep.view.ready = False
        event(20, "replica_draining", replica=name, in_flight=rep.view.in_flight)
        task = asyncio.create_task(self._finish_drain(name, rep), name=f"drain-{name}")
        self._drains.add(task)
        task.add_done_callback(self._drains.discard)
        return rep

    async def _finish_drain(self, key: str, rep: Replica) -> None:
        try:
            await rep.idle.wait()
        finally:
            for k, v in list(self._replicas.items()):
                if v is rep:
                    del self._replicas[k]
            for cb in self.on_removed:
                cb(rep)
            await rep.close()
            event(20, "replica_removed", replica=rep.name)

    async def apply(self, wanted: list[ReplicaConfig]) -> dict[str, list[str]]:
        """Make the set match ``wanted`` (config reload): add, drain, update in place."""
        by_key = {c.key: c for c in wanted}
        added, removed, updated = [], [], []
        for rep in self.active():
            if rep.name not in by_key:
                self.remove(rep.name)
                removed.append(rep.name)
        for key, c in by_key.items():
            rep = self._replicas.get(key)
            if rep is None or rep.draining:
                await self.add(c)
                added.append(key)
            elif rep.cfg != c:
                if rep.url != c.url or (rep.cfg.model, rep.cfg.gpu, rep.cfg.tp) != (
                    c.model,
                    c.gpu,
                    c.tp,
                ):
                    self.remove(key)
                    await self.add(c)
                else:
                    rep.cfg = c
                    rep.view.pool = c.pool
                    rep.view.max_in_flight = c.max_in_flight
                updated.append(key)
        return {"added": added, "removed": removed, "updated": updated}

    async def close(self, timeout: float = 0.0) -> None:
        """Drain every replica (waiting up to ``timeout`` s for requests in flight), close."""
        for rep in self.active():
            self.remove(rep.name)
        if self._drains:
            _, pending = await asyncio.wait(list(self._drains), timeout=max(0.0, timeout))
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
