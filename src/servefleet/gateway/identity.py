"""Who a request is, for rate limits: the authenticated API key, never what a client says.

Rule (the first that applies):

1. ``Authorization: Bearer KEY`` whose SHA-256 is in the key store (``auth.keys_file``, and
   ``auth.redis_hash`` in the rate limiter's Redis) → the key's name and tier;
2. ``auth.required`` and no known key → 401 (503 while Redis, where an unseen key would be, is
   down; a key seen before keeps its identity through the outage);
3. ``auth.user_header`` is set and the peer is one of ``auth.trusted_proxies`` (an upstream
   that authenticated the user itself) → that header's value, default tier;
4. otherwise → the peer's address, default tier.

A header or body field (``X-User-ID``, ``user``) from a client that is not a trusted proxy
never picks a bucket, and an unknown key is no identity (anyone can invent keys).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from servefleet.gateway.config import AuthConfig, ConfigError
from servefleet.gateway.errors import GatewayError
from servefleet.yaml_lines import syntax_error

DEFAULT_TIER = "default"
REDIS_CACHE_S = 10.0
"""How long a key looked up in Redis (known or not) is trusted without asking again; while
Redis is down, what was last learnt of a key holds on (it is not forgotten)."""


class KeysUnavailable(Exception):
    """Redis, where the key would be, is down, and the key was never seen."""


@dataclass(frozen=True, slots=True)
class Identity:
    user: str
    """The rate-limit bucket: ``key:NAME``, ``user:VALUE`` (trusted proxy) or ``ip:ADDR``."""
    tier: str = DEFAULT_TIER


@dataclass(frozen=True, slots=True)
class KeyEntry:
    name: str
    tier: str = DEFAULT_TIER


def key_hash(key: str) -> str:
    """The SHA-256 (hex) under which a key is stored: ``printf %s KEY | sha256sum``."""
    return hashlib.sha256(key.encode()).hexdigest()


def load_keys(path: str | Path) -> dict[str, KeyEntry]:
    """``keys: [{name, sha256, tier}]`` from a YAML file."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as exc:
        raise ConfigError(f"auth.keys_file {p}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"auth.keys_file {syntax_error(str(p), exc)}") from None
    keys = (data or {}).get("keys") if isinstance(data, dict) else None
    if not isinstance(keys, list):
        raise ConfigError(f"auth.keys_file {p}: expected `keys: [{{name, sha256, tier}}]`")
    out: dict[str, KeyEntry] = {}
    for i, k in enumerate(keys):
        h = k.get("sha256") if isinstance(k, dict) else None
        if not isinstance(h, str) or len(h) != 64 or not isinstance(k.get("name"), str):
            raise ConfigError(f"auth.keys_file {p}: keys.{i} needs a name and a 64-hex sha256")
        out[h.lower()] = KeyEntry(k["name"], str(k.get("tier", DEFAULT_TIER)))
    return out


class KeyStore:
    """SHA-256 of a key → its entry: from the keys file, then (cached) from a Redis hash."""

    def __init__(self, cfg: AuthConfig, redis: Any = None, clock=time.monotonic) -> None:
        self.cfg = cfg
        self.keys = load_keys(cfg.keys_file) if cfg.keys_file else {}
        self.redis = redis if cfg.redis_hash else None
        self.clock = clock
        self._cache: dict[str, tuple[float, KeyEntry | None]] = {}
        self._proxies = [ipaddress.ip_network(p, strict=False) for p in cfg.trusted_proxies]

    async def lookup(self, key: str) -> KeyEntry | None:
        h = key_hash(key)
        entry = self.keys.get(h)
        if entry is not None or self.redis is None:
            return entry
        now = self.clock()
        hit = self._cache.get(h)
        if hit is not None and hit[0] > now:
            return hit[1]
        try:
            raw = await self.redis.hget(self.cfg.redis_hash, h)
        except Exception:  # Redis down: what the cache knew, however old (never a 500)
            if hit is not None:
                return hit[1]
            raise KeysUnavailable from None
        entry = _entry(raw)
        if len(self._cache) > 100_000:
            self._cache.clear()
        self._cache[h] = (now + REDIS_CACHE_S, entry)
        return entry

    def trusted(self, peer: str | None) -> bool:
        if not peer or not self._proxies:
            return False
        try:
            addr = ipaddress.ip_address(peer)
        except ValueError:
            return False
        return any(addr in net for net in self._proxies)

    async def identify(self, auth: str | None, headers, peer: str | None) -> Identity:
        down = False
        if auth and (self.keys or self.redis is not None) and auth[:7].lower() == "bearer ":
            try:
                entry = await self.lookup(auth[7:].strip())
            except KeysUnavailable:
                entry, down = None, True
            if entry is not None:
                return Identity(f"key:{entry.name}", entry.tier)
        if self.cfg.required and down:  # the key may well be valid: not a 401
            raise GatewayError(
                503,
                "API keys cannot be checked right now (the key store is unavailable); retry.",
                "auth_unavailable",
                retry_after=1.0,
            )
        if self.cfg.required:
            raise GatewayError(
                401,
                "Incorrect or missing API key: give `Authorization: Bearer <key>`.",
                "invalid_api_key",
            )
        hdr = self.cfg.user_header
        if hdr and self.trusted(peer):
            user = headers.get(hdr)
            if user:
                return Identity(f"user:{user[:200]}")
        return Identity(f"ip:{peer or 'unknown'}")


def _entry(raw: Any) -> KeyEntry | None:
    """A Redis hash value: ``{"name": ..., "tier": ...}`` (JSON) or a bare name."""
    if raw is None:
        return None
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
    try:
        obj = json.loads(text)
    except ValueError:
        return KeyEntry(text)
    if isinstance(obj, dict) and isinstance(obj.get("name"), str):
        return KeyEntry(obj["name"], str(obj.get("tier", DEFAULT_TIER)))
    return KeyEntry(text)
