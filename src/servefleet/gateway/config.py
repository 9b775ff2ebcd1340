"""The gateway's settings: a YAML file (``--config``) and/or command-line flags, validated
with pydantic. Every section has defaults, so ``replicas:`` alone is a valid file."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from servefleet.routing import POLICIES
from servefleet.yaml_lines import compose, line_of, syntax_error


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ReplicaConfig(_Strict):
    url: str
    """Base URL of a vLLM-compatible server, e.g. http://10.0.0.5:8000."""
    name: str | None = None
    """Defaults to host:port of the URL."""
    pool: str = "default"
    max_in_flight: int | None = Field(default=None, ge=1)
    api_key: str | None = None
    """Sent upstream as `Authorization: Bearer`; None: the client's header is passed on."""
    tls_verify: bool | str = True
    """https replicas: true checks the certificate against the system's CAs, a path against
    that CA bundle, false not at all."""
    # what the replica runs, for the predicted-latency policy's cost model (all optional)
    model: str | None = None
    gpu: str | None = None
    tp: int = Field(default=1, ge=1)
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    max_num_seqs: int | None = Field(default=None, ge=1)

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        v = v.strip().rstrip("/")
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"replica url {v!r} must start with http:// or https://")
        return v

    @property
    def key(self) -> str:
        if self.name:
            return self.name
        return self.url.split("://", 1)[1]


# -- replicas found at run time (gateway/discovery.py) ---------------------------------------
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class ServiceSource(_Strict):
    service: str
    """A (headless) Service whose endpoints are replicas."""
    port: str | int = "http"
    """The port's name in the EndpointSlices, or its number."""
    replica: dict[str, Any] = Field(default_factory=dict)
    """What every replica of this Service is, as in ``replicas:`` (pool, max_in_flight, model,
    gpu, tp, ...), without url and name."""

    @field_validator("replica")
    @classmethod
    def _replica_fields(cls, v: dict[str, Any]) -> dict[str, Any]:
        if {"url", "name"} & set(v):
            raise ValueError("replica: url and name come from the endpoints; leave them out")
        ReplicaConfig.model_validate({**v, "url": "http://check"})
        return v


class KubernetesDiscovery(_Strict):
    services: list[ServiceSource] = Field(min_length=1)
    namespace: str | None = None
    """Default: the pod's own namespace."""
    api_url: str | None = None
    """Default: the in-cluster API server (KUBERNETES_SERVICE_HOST/PORT)."""
    token_file: str | None = str(SERVICE_ACCOUNT / "token")
    """Bearer token, re-read at every poll (projected tokens rotate); None: no token."""
    ca_file: str | None = str(SERVICE_ACCOUNT / "ca.crt")
    """CA bundle of the API server's certificate (https only)."""
    interval: float = Field(default=5.0, gt=0)
    timeout: float = Field(default=5.0, gt=0)
    ready_only: bool = False


class DiscoveryConfig(_Strict):
    kubernetes: KubernetesDiscovery


class PolicyConfig(_Strict):
    name: str = "least-outstanding"
    options: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the policy (e.g. load_factor: 1.25; threshold: 1500)."""

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in POLICIES:
            raise ValueError(f"unknown routing policy {v!r}; choose one of {', '.join(POLICIES)}")
        return v


class HealthConfig(_Strict):
    path: str = "/health"
    interval: float = Field(default=2.0, gt=0)
    timeout: float = Field(default=1.0, gt=0)
    healthy_threshold: int = Field(default=2, ge=1)
    """Consecutive successes before a replica gets traffic."""
    unhealthy_threshold: int = Field(default=3, ge=1)
    """Consecutive failures before a ready replica is ejected."""
    panic_threshold: float = Field(default=0.5, ge=0, le=1)
    """Below this fraction of healthy replicas (among those that have been ready), ejected
    ones get traffic too, rather than none at all (0: never)."""


class BreakerConfig(_Strict):
    consecutive_failures: int = Field(default=5, ge=1)
    """Connect errors, 5xx and timeouts in a row that open the breaker."""
    base_ejection: float = Field(default=2.0, gt=0)
    """Seconds open the first time; doubled at each re-open, up to max_ejection."""
    max_ejection: float = Field(default=60.0, gt=0)


class AdmissionConfig(_Strict):
    max_concurrency: int = Field(default=4096, ge=1)
    """Requests forwarded at once, gateway-wide; more wait in a FIFO queue."""
    max_queue: int = Field(default=4096, ge=0)
    max_queue_wait: float = Field(default=30.0, gt=0)
    max_body_bytes: int = Field(default=8 << 20, ge=1024)
    """Larger bodies get 413 (from Content-Length, before reading). The limit is lower while
    the fleet's max_model_len is known: 64 KiB + 2 x max_model_len x max_token_bytes (a
    prompt that long is too long whatever its tokens)."""
    max_token_bytes: int = Field(default=256, ge=1)
    """ASSUMED: no token of the model's vocabulary is longer than this many UTF-8 bytes, so a
    prompt of B bytes has at least B / max_token_bytes tokens: a prompt that bound proves too
    long is refused without asking a replica's /tokenize."""
    max_model_len: int | None = Field(default=None, ge=1)
    """None: the smallest max_model_len the ready replicas report in /v1/models."""
    max_streams_per_client: int | None = Field(default=None, ge=1)
    """Streamed requests one client (its API key, else its address: gateway/identity.py) may
    have open at once; more get 429 `too_many_streams`. None: no cap."""
    max_n: int = Field(default=16, ge=1)
    """Completions one request may ask for (`n`, `best_of`): 400 beyond."""
    token_count: Literal["tokenize", "estimate"] = "tokenize"
    """How prompt tokens are counted for the context-length check: `tokenize` asks a replica's
    /tokenize when the UTF-8 byte count (an upper bound) does not already prove that the prompt
    fits; `estimate` uses characters / 4 and never asks."""


class TierLimits(_Strict):
    requests_per_second: float | None = Field(default=None, gt=0)
    request_burst: float | None = Field(
        default=None, ge=1, validation_alias=AliasChoices("request_burst", "burst")
    )
    """Bucket size (default: max(1, requests_per_second)); ``burst`` is accepted too."""
    tokens_per_minute: float | None = Field(default=None, gt=0)
    token_burst: float | None = Field(default=None, ge=1)
    """Bucket size (default: tokens_per_minute)."""

    @property
    def enabled(self) -> bool:
        return self.requests_per_second is not None or self.tokens_per_minute is not None


class RateLimitConfig(TierLimits):
    """The default tier's limits (the top-level fields), other tiers by name."""

    tiers: dict[str, TierLimits] = Field(default_factory=dict)
    """Limits of the tiers that API keys name (auth.keys_file); a tier not listed here gets
    the default limits."""
    redis_url: str | None = None
    """Share the buckets between gateways through this Redis (redis://host:port/db)."""
    redis_password_file: str | None = None
    """A file holding Redis's password (a mounted secret): kept out of the config and URL."""
    key_prefix: str = "servefleet:rl:"
    redis_timeout: float = Field(default=0.25, gt=0)
    """Seconds a Redis call may take before the gateway counts Redis as down."""
    users_per_address: int = Field(default=8, ge=1)
    """The nginx export only (the gateway verifies keys and needs no such bound): nginx cannot
    verify API keys, so an invented key would get a fresh bucket; one client address is also
    held to this many users' limits (the users behind your largest NAT or app server)."""
    on_redis_error: Literal["local", "closed"] = "local"
    """Redis down or hung: `local` counts in this gateway's own buckets meanwhile (fail open,
    N gateways then allow up to N x the rate; a warning metric and /ready say so); `closed`
    answers 503 until Redis is back."""

    @property
    def enabled(self) -> bool:
        return super().enabled or any(t.enabled for t in self.tiers.values())


class AuthConfig(_Strict):
    """Who a request is (gateway/identity.py): for rate limits, never a client's header."""

    keys_file: str | None = None
    """YAML `keys: [{name, sha256, tier}]`: the SHA-256 of each API key clients may use."""
    redis_hash: str | None = None
    """A Redis hash (in rate_limit.redis_url) of SHA-256 → {"name", "tier"} (JSON)."""
    required: bool = False
    """True: a request without a known key gets 401."""
    user_header: str | None = None
    """A header naming the user (e.g. X-User-ID), believed only from trusted_proxies."""
    trusted_proxies: list[str] = Field(default_factory=list)
    """Addresses or CIDRs of upstreams that authenticate users and set user_header."""
    open_routes: list[Literal["/v1/models", "/tokenize", "/detokenize"]] = Field(
        default_factory=list
    )
    """Routes answered to anyone, without identity or rate limits (by default every route
    but /health and /ready is behind the same identity and limits as generation)."""
    forward_client_key: bool = False
    """Pass the client's `Authorization` header on to replicas that have no api_key of their
    own (off: a client's key never leaves the gateway)."""


class ServerConfig(_Strict):
    """The client side: how long a client may take, how much it may send."""

    header_timeout: float = Field(default=10.0, gt=0)
    """Seconds to receive a request's head (also how long an idle keep-alive connection
    stays open): slow or silent connections are closed."""
    body_timeout: float = Field(default=30.0, gt=0)
    """Seconds to receive a request's body once its head is in: 408 after that."""
    max_head_bytes: int = Field(default=32 << 10, ge=1024)
    """Bytes a request's head (request line and headers) may have: 431 beyond, and the
    connection closed, before any other work."""
    max_header_count: int = Field(default=64, ge=1)
    """Header lines a request may have: 431 beyond."""
    max_header_line: int = Field(default=8190, ge=256)
    """Bytes one header line (or the request line) may have: 431 beyond."""
    max_connections_per_address: int | None = Field(default=1024, ge=1)
    """Connections one client address may hold open at once (auth.trusted_proxies are
    exempt): one more is answered 429 and closed at once. None: no cap."""
    max_buffered_bytes: int = Field(default=256 << 20, ge=1 << 20)
    """Bytes of request bodies the gateway holds at once, all requests together: a body that
    would go beyond is refused with 503 (before it is read, when its Content-Length says so)."""


class RetryConfig(_Strict):
    max_attempts: int = Field(default=3, ge=1)
    """Attempts per request, on distinct replicas (the first one included)."""
    backoff_base: float = Field(default=0.005, ge=0)
    backoff_max: float = Field(default=0.2, ge=0)


class StreamConfig(_Strict):
    connect_timeout: float = Field(default=3.0, gt=0)
    keepalive_timeout: float = Field(default=4.0, gt=0)
    """Seconds an idle connection to a replica is kept for reuse (less when the replica's
    `Keep-Alive: timeout=` says so): below uvicorn's 5 s (vLLM), so that no request is sent
    on a connection the replica is closing. One closed before any byte of its answer anyway
    is sent again once on a new connection, and blamed on no one."""
    idle_timeout: float = Field(default=60.0, gt=0)
    """A replica silent this long in a stream (or before a stream's head) is taken as dead:
    the stream resumes elsewhere."""
    response_timeout: float = Field(default=600.0, gt=0)
    """Seconds a non-streamed answer may take (it comes whole, at the end)."""
    stall_factor: float = Field(default=25.0, gt=1)
    """A replica whose streams all got no event for this many times its usual gap between
    events (and at least ``min_stall``) is hung: ejected, its streams resumed elsewhere."""
    min_stall: float = Field(default=2.0, gt=0)
    first_token_factor: float = Field(default=10.0, gt=1)
    """A stream still without its first event after this many times the replica's usual
    time to first token (learned; per prompt token for long prompts), while the replica sent
    no event to any stream meanwhile, finds the replica hung before answering: it is ejected
    and the request retried elsewhere (nothing was sent to the client yet)."""
    min_first_token: float = Field(default=5.0, gt=0)
    """The first-token deadline's floor, in seconds (its ceiling is ``idle_timeout``)."""
    write_timeout: float = Field(default=30.0, gt=0)
    """Seconds a write to a streaming client may wait for that client to read (its socket
    full): then that stream alone ends, freeing its admission slot. A stream paused by its
    client is never evidence against its replica."""
    resume: bool = True
    max_resumes: int = Field(default=2, ge=0)
    max_resume_log_bytes: int = Field(default=4 << 20, ge=0)
    """Bytes of a resumable stream the gateway keeps to resume it elsewhere (streams that
    cannot resume keep none): a longer stream is no longer resumable."""
    max_event_bytes: int = Field(default=1 << 20, ge=1024)
    """Bytes an upstream SSE event may have: a replica sending a longer one has failed."""


class GatewayConfig(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    replicas: list[ReplicaConfig] = Field(default_factory=list)
    max_in_flight_per_replica: int | None = Field(default=None, ge=1)
    """The cap of every replica that sets no ``max_in_flight`` of its own (None: no cap)."""
    discovery: DiscoveryConfig | None = None
    """Replicas found at run time (gateway/discovery.py), in addition to ``replicas``."""
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    health: HealthConfig = Field(default_factory=HealthConfig)
    breaker: BreakerConfig = Field(default_factory=BreakerConfig)
    admission: AdmissionConfig = Field(default_factory=AdmissionConfig)
    rate_limit: RateLimitConfig = Field(default_factory=RateLimitConfig)
    retry: RetryConfig = Field(default_factory=RetryConfig)
    stream: StreamConfig = Field(default_factory=StreamConfig)
    auth: AuthConfig = Field(default_factory=AuthConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    admin_token: str | None = None
    """Enables /admin/* with `Authorization: Bearer TOKEN`; when the gateway listens beyond
    loopback, /fleet and /metrics need it too."""
    admin_token_file: str | None = None
    """A file holding the admin token (a mounted secret), read at start when ``admin_token``
    is not given; a file that is absent or empty means no token."""
    drain_timeout: float = Field(default=30.0, ge=0)
    scrape_interval: float = Field(default=10.0, gt=0)
    """Seconds between scrapes of the replicas' /metrics (prefix-cache hits, queue)."""
    log_level: str = "info"

    @field_validator("policy", mode="before")
    @classmethod
    def _policy_by_name(cls, v: Any) -> Any:
        """``policy: prefix-affinity`` is short for ``policy: {name: prefix-affinity}``."""
        return {"name": v} if isinstance(v, str) else v

    @field_validator("rate_limit", mode="before")
    @classmethod
    def _no_limits(cls, v: Any) -> Any:
        """``rate_limit: null``: no limits (the default)."""
        return {} if v is None else v

    @field_validator("admin_token")
    @classmethod
    def _empty_token_is_none(cls, value: str | None) -> str | None:
        """An empty token (an unset container variable) turns the admin endpoints off; it must
        never match ``Authorization: Bearer `` with nothing after it."""
        return value.strip() or None if value is not None else None

    @field_validator("log_level")
    @classmethod
    def _level(cls, v: str) -> str:
        v = v.lower()
        if v not in ("debug", "info", "warning", "error"):
            raise ValueError(f"log_level {v!r}: use debug, info, warning or error")
        return v

    @model_validator(mode="after")
    def _token_from_file(self) -> GatewayConfig:
        if self.admin_token is None and self.admin_token_file is not None:
            try:
                self.admin_token = Path(self.admin_token_file).read_text().strip() or None
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise ValueError(
                    f"admin_token_file {self.admin_token_file}: {exc.strerror}"
                ) from None
        return self

    @model_validator(mode="after")
    def _unique(self) -> GatewayConfig:
        seen: set[str] = set()
        for r in self.replicas:
            if r.key in seen:
                raise ValueError(f"two replicas are named {r.key!r}: give each a unique name")
            seen.add(r.key)
            if r.max_in_flight is None:
                r.max_in_flight = self.max_in_flight_per_replica
        return self


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the field and the fix."""


def _explain(exc: ValidationError, where: str, root: yaml.Node | None = None) -> ConfigError:
    problems = []
    for e in exc.errors(include_url=False):
        loc = ".".join(str(x) for x in e["loc"]) or "(top level)"
        line = line_of(root, e["loc"])
        at = f"line {line}: " if line is not None else ""
        problems.append(f"{at}{loc}: {str(e['msg']).removeprefix('Value error, ')}")
    return ConfigError(f"{where}: " + "; ".join(problems))


def parse_config(
    data: Any, where: str = "gateway config", root: yaml.Node | None = None
) -> GatewayConfig:
    """``root``: the YAML's node tree, to name each error's line."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping of settings, got {type(data).__name__}")
    try:
        return GatewayConfig.model_validate(data)
    except ValidationError as exc:
        raise _explain(exc, where, root) from None


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> GatewayConfig:
    """The YAML file at ``path`` with ``overrides`` (top-level keys) applied."""
    p = Path(path)
    try:
        text = p.read_text()
        data = yaml.safe_load(text)
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(syntax_error(str(p), exc)) from None
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping of settings at the top level")
    return parse_config({**(data or {}), **(overrides or {})}, str(p), compose(text))
