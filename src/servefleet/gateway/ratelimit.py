"""Per-user token buckets: requests per second and tokens per minute, with limits per tier.

``MemoryLimiter`` keeps the buckets in this process; ``RedisLimiter`` keeps them in Redis so
that several gateways share them, checking and charging both buckets in one Lua script
(atomic, and timed by the Redis server's clock so gateways' clocks need not agree). A request
is charged its prompt tokens (estimated) plus ``max_tokens``; it passes only when both buckets
hold enough, and then both are charged. Who the user is comes from ``identity.py``.

Redis down or hung (each call has ``redis_timeout``): by default the gateway counts in its own
buckets meanwhile (fail open: N gateways then let through up to N x the rate), says so in
``/ready`` and in ``servefleet_gateway_ratelimit_degraded``, and tries Redis again every
``REDIS_RETRY_S``; it starts without Redis and uses it once it answers. ``on_redis_error:
closed`` answers 503 instead.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from servefleet.gateway.config import ConfigError, RateLimitConfig, TierLimits
from servefleet.gateway.errors import GatewayError
from servefleet.gateway.log import event

REDIS_RETRY_S = 1.0
"""While Redis is down, how often a request tries it again (the others use local buckets)."""


@dataclass(slots=True)
class Verdict:
    allowed: bool
    retry_after: float = 0.0
    """Seconds until the request would pass (when not allowed)."""
    which: str = ""
    """"requests" or "tokens": the bucket that refused."""


@dataclass(frozen=True, slots=True)
class Limits:
    req_rate: float  # per second; 0: off
    req_burst: float
    tok_rate: float  # per second; 0: off
    tok_burst: float

    @classmethod
    def of(cls, cfg: TierLimits) -> Limits:
        rps = cfg.requests_per_second or 0.0
        tpm = cfg.tokens_per_minute or 0.0
        return cls(
            rps,
            cfg.request_burst or max(1.0, rps),
            tpm / 60.0,
            cfg.token_burst or tpm,
        )


def tier_limits(cfg: RateLimitConfig) -> dict[str, Limits]:
    """Limits by tier name ("default": the top-level fields)."""
    out = {"default": Limits.of(cfg)}
    out.update({name: Limits.of(t) for name, t in cfg.tiers.items()})
    return out


class Limiter(Protocol):
    async def check(self, user: str, tokens: int, lim: Limits) -> Verdict: ...

    def status(self) -> dict: ...

    async def close(self) -> None: ...


class Bucket:
    """A token bucket: ``burst`` capacity, refilled at ``rate`` per second (pure; the time
    is passed in)."""

    __slots__ = ("burst", "level", "rate", "ts")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate, self.burst, self.level, self.ts = rate, burst, burst, now

    def refill(self, now: float) -> float:
        self.level = min(self.burst, self.level + max(0.0, now - self.ts) * self.rate)
        self.ts = now
        return self.level

    def wait_for(self, amount: float) -> float:
        return 0.0 if self.level >= amount else (amount - self.level) / self.rate


class MemoryLimiter:
    MAX_USERS = 100_000

    def __init__(self, clock=time.monotonic) -> None:
        self.clock = clock
        self._buckets: dict[str, tuple[Bucket | None, Bucket | None]] = {}

    async def check(self, user: str, tokens: int, lim: Limits) -> Verdict:
        return self.check_now(user, tokens, lim, self.clock())

    def status(self) -> dict:
        return {"backend": "memory"}

    def check_now(self, user: str, tokens: int, lim: Limits, now: float) -> Verdict:
        pair = self._buckets.get(user)
        if pair is None:
            if len(self._buckets) >= self.MAX_USERS:
                self._buckets.clear()  # crude bound; full buckets are the default anyway
            pair = (
                Bucket(lim.req_rate, lim.req_burst, now) if lim.req_rate else None,
                Bucket(lim.tok_rate, lim.tok_burst, now) if lim.tok_rate else None,
            )
            self._buckets[user] = pair
        rb, tb = pair
        cost = min(float(tokens), lim.tok_burst) if tb else 0.0
        wait_r = wait_t = 0.0
        if rb is not None:
            rb.refill(now)
            wait_r = rb.wait_for(1.0)
        if tb is not None:
            tb.refill(now)
            wait_t = tb.wait_for(cost)
        if wait_r or wait_t:
            return Verdict(False, max(wait_r, wait_t), "requests" if wait_r >= wait_t else "tokens")
        if rb is not None:
            rb.level -= 1.0
        if tb is not None:
            tb.level -= cost
        return Verdict(True)

    async def close(self) -> None:
        pass


LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local rr, rb = tonumber(ARGV[1]), tonumber(ARGV[2])
local tr, tb = tonumber(ARGV[3]), tonumber(ARGV[4])
local cost = math.min(tonumber(ARGV[5]), tb)
local function level(key, rate, burst)
  local v = redis.call('HMGET', key, 'l', 'ts')
  local l, ts = tonumber(v[1]), tonumber(v[2])
  if l == nil then return burst end
  return math.min(burst, l + math.max(0, now - ts) * rate)
end
local lr, lt = 0, 0
local wr, wt = 0, 0
if rr > 0 then
  lr = level(KEYS[1], rr, rb)
  if lr < 1 then wr = (1 - lr) / rr end
end
if tr > 0 then
  lt = level(KEYS[2], tr, tb)
  if lt < cost then wt = (cost - lt) / tr end
end
if wr > 0 or wt > 0 then
  local which = 'requests'
  if wt > wr then which = 'tokens' end
  return {0, tostring(math.max(wr, wt)), which}
end
if rr > 0 then
  redis.call('HSET', KEYS[1], 'l', tostring(lr - 1), 'ts', tostring(now))
  redis.call('PEXPIRE', KEYS[1], math.ceil(rb / rr * 1000) + 1000)
end
if tr > 0 then
  redis.call('HSET', KEYS[2], 'l', tostring(lt - cost), 'ts', tostring(now))
  redis.call('PEXPIRE', KEYS[2], math.ceil(tb / tr * 1000) + 1000)
end
return {1, '0', ''}
"""


class RedisLimiter:
    """Buckets in Redis (``pip install 'servefleet[redis]'``), local ones while it is down."""

    def __init__(self, cfg: RateLimitConfig, on_degraded=None, on_fallback=None) -> None:
        try:
            import redis.asyncio as aioredis
        except ImportError as exc:
            raise ImportError(
                "rate_limit.redis_url needs the redis client: pip install 'servefleet[redis]'"
            ) from exc
        assert cfg.redis_url is not None
        self.cfg = cfg
        self.prefix = cfg.key_prefix
        t = cfg.redis_timeout
        extra = {}
        if cfg.redis_password_file:
            try:
                extra["password"] = Path(cfg.redis_password_file).read_text().strip()
            except OSError as exc:
                raise ConfigError(
                    f"rate_limit.redis_password_file {cfg.redis_password_file}: {exc.strerror}"
                ) from None
        self.redis = aioredis.from_url(
            cfg.redis_url,
            socket_timeout=t,
            socket_connect_timeout=t,
            retry_on_timeout=False,
            **extra,
        )
        self._script = self.redis.register_script(LUA)
        self.local = MemoryLimiter()
        self.degraded: str | None = None
        """Why Redis is not used now (None: it is)."""
        self._retry_at = 0.0
        self.on_degraded = on_degraded
        """Called with True/False when the limiter falls back to local buckets / recovers."""
        self.on_fallback = on_fallback
        """Called for each check made without Redis."""

    def status(self) -> dict:
        s: dict = {"backend": "redis", "redis_url": _redacted(self.cfg.redis_url or "")}
        if self.degraded is not None:
            s["degraded"] = self.degraded
            s["backend"] = "local" if self.cfg.on_redis_error == "local" else "none"
        return s

    async def check(self, user: str, tokens: int, lim: Limits) -> Verdict:
        now = time.monotonic()
        if self.degraded is not None and now < self._retry_at:
            return await self._fallback(user, tokens, lim)
        keys = [f"{self.prefix}{user}:req", f"{self.prefix}{user}:tok"]
        args = [lim.req_rate, lim.req_burst, lim.tok_rate, lim.tok_burst or 1, tokens]
        try:
            allowed, wait, which = await self._script(keys=keys, args=args)
        except Exception as exc:  # any Redis trouble: never a 500 (redis.RedisError, OSError)
            self._down(f"{type(exc).__name__}: {exc}"[:200], now)
            return await self._fallback(user, tokens, lim)
        if self.degraded is not None:
            event(logging.WARNING, "ratelimit_redis_back", was=self.degraded)
            self.degraded = None
            if self.on_degraded is not None:
                self.on_degraded(False)
        if int(allowed):
            return Verdict(True)
        w = which.decode() if isinstance(which, bytes) else str(which)
        return Verdict(False, float(wait), w)

    def _down(self, why: str, now: float) -> None:
        if self.degraded is None:
            event(logging.WARNING, "ratelimit_redis_down", why=why,
                  fallback=self.cfg.on_redis_error)  # fmt: skip
            if self.on_degraded is not None:
                self.on_degraded(True)
        self.degraded = why
        self._retry_at = now + REDIS_RETRY_S

    async def _fallback(self, user: str, tokens: int, lim: Limits) -> Verdict:
        if self.on_fallback is not None:
            self.on_fallback()
        if self.cfg.on_redis_error == "closed":
            raise GatewayError(
                503,
                f"The rate limiter's Redis is unavailable ({self.degraded}); retry later.",
                "rate_limiter_unavailable",
                retry_after=REDIS_RETRY_S,
            )
        return await self.local.check(user, tokens, lim)

    async def close(self) -> None:
        await self.redis.aclose()


def _redacted(url: str) -> str:
    """A Redis URL without its password."""
    if "@" not in url:
        return url
    scheme, _, rest = url.partition("://")
    return f"{scheme}://***@{rest.rpartition('@')[2]}"


def make_limiter(cfg: RateLimitConfig, on_degraded=None, on_fallback=None) -> Limiter | None:
    """None when no limit is set; Redis-backed with ``redis_url``; else in memory. The
    callbacks report a Redis outage (``on_degraded(bool)``) and each check made without it."""
    if not cfg.enabled:
        return None
    if cfg.redis_url:
        return RedisLimiter(cfg, on_degraded, on_fallback)
    return MemoryLimiter()
