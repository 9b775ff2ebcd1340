"""``servefleet export nginx``: nginx in place of the servefleet gateway, keeping what nginx can
keep of the gateway's protections (docs/export.md).

Rule, what maps to what:

* retry before the first byte (gateway: ``retry``) -> ``proxy_next_upstream error timeout
  http_502 http_503 non_idempotent``: a POST answered 502/503 or refused at connect has not
  reached an engine, so it goes to the next replica; nginx retries only while nothing has been
  sent to the client.
* the cap per replica (``gateway.max_in_flight_per_replica``) -> ``max_conns`` in an upstream
  ``zone`` (without the zone each worker process would count alone).
* per-user limits (``gateway.rate_limit``) -> ``limit_req`` keyed by the API key (the
  ``Authorization`` header; the client address without one).
* length pools -> the request body's size (``Content-Length``), the one sign of prompt length
  nginx sees without reading the body.
* health -> passive: ``max_fails``/``fail_timeout``, as many failures as the gateway's
  ``health.unhealthy_threshold``.
* policy -> ``hash`` on the session header for the affinity policies, ``least_conn`` for the
  load-based ones, round robin for ``round-robin``.
"""

from __future__ import annotations

import math

from servefleet.gateway.config import RateLimitConfig
from servefleet.plan.fleet_yaml import Fleet, Replica
from servefleet.routing.prefix import CHARS_PER_TOKEN

from .commands import LOCAL_HOSTS
from .export_common import slug, unique

LONG_PROMPT_TOKENS = 1500
"""The ``length-pools`` policy's default threshold (routing/pools.py)."""
MAX_FAILS = 3
"""Failures within ``FAIL_TIMEOUT`` that take a replica out (the gateway's
``health.unhealthy_threshold``)."""
FAIL_TIMEOUT_S = 10
"""Seconds a failed replica is skipped; then one real request tries it again (and is retried
elsewhere at once if it fails): a loading replica costs one fast retry per 10 s."""
RETRY_TRIES = 3
"""Attempts per request on distinct replicas (the gateway's ``retry.max_attempts``)."""
CONNECT_TIMEOUT_S = 3
"""The gateway's ``stream.connect_timeout``."""

AFFINITY_POLICIES = {"session-hash", "prefix-affinity", "length-pools-prefix"}
"""Policies that keep a session on one replica: nginx hashes the session header."""
ROUND_ROBIN = {"round-robin"}

CANNOT = """\
# What the servefleet gateway does and nginx cannot (run `servefleet gateway` for these):
#   * resume a stream cut mid-way on another replica: nginx retries only before the first byte
#   * wait at the cap: when every replica of a pool is at max_conns, nginx answers 503 at once
#     (the gateway queues; NGINX Plus has `queue`)
#   * route by predicted latency, by prompt prefix (it does not read the body) or by tokens in
#     flight; pools by body bytes, not tokens
#   * count tokens: no tokens-per-minute limit, no context-length check before forwarding
#   * active health checks (NGINX Plus `health_check`): a replica that failed is tried again
#     with a real request after fail_timeout (retried elsewhere at once if it fails again)
#   * share limits and caps between several nginx instances: each counts alone (the gateway
#     shares rate limits through Redis)
#   * per-replica metrics and GET /fleet (nginx has stub_status only)"""


def at_least_regex(n: int) -> str:
    """A regex matching the decimal integers >= `n` (no leading zeros), anchored.

    Rule: more digits than `n`; or the same digits as `n` up to some position, then a larger
    digit there and any digits after; or `n` itself."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    s = str(n)
    alts = [f"[1-9][0-9]{{{len(s)},}}"]
    for i, ch in enumerate(s):
        if ch == "9":
            continue
        lo = int(ch) + 1
        rest = len(s) - i - 1
        alts.append(s[:i] + (f"[{lo}-9]" if lo < 9 else "9") + (f"[0-9]{{{rest}}}" if rest else ""))
    alts.append(s)
    return "^(" + "|".join(alts) + ")$"


def _balance(policy: str) -> str | None:
    if policy in AFFINITY_POLICIES:
        return "hash $servefleet_session consistent;  # a session stays on the replica with its KV"
    if policy in ROUND_ROBIN:
        return None
    return "least_conn;  # the replica with the fewest requests in flight"


def _nginx_rate(rps: float) -> str:
    """nginx takes whole requests per second or per minute."""
    if rps >= 1 and float(rps).is_integer():
        return f"{int(rps)}r/s"
    return f"{max(1, round(rps * 60))}r/m"


def _limit_lines(limit: RateLimitConfig) -> tuple[list[str], list[str]]:
    """(http-level lines, location-level lines) of the per-user request limit."""
    if limit.requests_per_second is None:
        return ["    # no per-user request limit: set gateway.rate_limit in fleet.yaml"], []
    rps = limit.requests_per_second
    burst = math.floor(limit.request_burst or max(1, rps))
    shared = limit.users_per_address
    return [
        "    # per-user request rate: the user is the API key (Authorization), else the address",
        '    map $http_authorization $servefleet_user { "" $binary_remote_addr; '
        "default $http_authorization; }",
        f"    limit_req_zone $servefleet_user zone=per_user:10m rate={_nginx_rate(rps)};",
        "    # nginx does not verify API keys: an invented key would get a fresh bucket, so every",
        f"    # address is also held to {shared} users' worth (NAT, an app server); the gateway",
        "    # verifies keys (auth.keys_file) and needs no such bound",
        "    limit_req_zone $binary_remote_addr zone=per_address:10m "
        f"rate={_nginx_rate(rps * shared)};",
        "    limit_req_status 429;",
    ], [
        # nginx lets burst + 1 through at once; the gateway's bucket holds `burst`
        f"            limit_req zone=per_user burst={burst - 1} nodelay;"
        f"  # {rps:g} requests/s, {burst} at once",
        f"            limit_req zone=per_address burst={burst * shared - 1} nodelay;",
    ]


def _error_location(name: str, status: int, code: str, message: str, retry_after: int) -> str:
    body = (
        f'{{"error": {{"message": "{message}", "type": "'
        f'{"rate_limit_error" if status == 429 else "server_error"}", "param": null, '
        f'"code": "{code}"}}}}'
    )
    return (
        f"        location {name} {{ default_type application/json; "
        f"add_header Retry-After {retry_after} always; return {status} '{body}'; }}"
    )


def _upstream_host(r: Replica, local: bool) -> str:
    return "127.0.0.1" if local or r.host in LOCAL_HOSTS else r.host


def nginx_conf(
    fleet: Fleet,
    *,
    listen: int | None = None,
    local: bool = False,
    long_body_bytes: int = LONG_PROMPT_TOKENS * CHARS_PER_TOKEN,
) -> str:
    """A complete nginx.conf for `fleet` (run it with `nginx -p DIR -c nginx.conf`)."""
    port = listen if listen is not None else fleet.gateway.port
    g = fleet.gateway
    pools: dict[str, list[Replica]] = {}
    for r in fleet.replicas:
        pools.setdefault(r.pool, []).append(r)
    cap = f" max_conns={g.max_in_flight_per_replica}" if g.max_in_flight_per_replica else ""
    http_limits, location_limits = _limit_lines(g.rate_limit)
    lines = [
        "# nginx.conf — generated by `servefleet export nginx` from fleet.yaml (docs/export.md)",
        CANNOT,
        "worker_processes auto;",
        "pid nginx.pid;",
        "error_log stderr warn;",
        "events { worker_connections 4096; }",
        "http {",
        "    access_log off;",
        "    client_body_temp_path client_body;",
        "    proxy_temp_path proxy_temp;",
        "    fastcgi_temp_path fastcgi_temp;",
        "    uwsgi_temp_path uwsgi_temp;",
        "    scgi_temp_path scgi_temp;",
        "    client_max_body_size 8m;",
        "    client_body_buffer_size 8m;  # prompts stay in memory: a retry resends them",
        '    map $http_x_session_id $servefleet_session { "" $http_x_user_id; '
        "default $http_x_session_id; }",
        *http_limits,
    ]
    taken: set[str] = set()
    upstream = {p: unique(f"pool_{slug(p).replace('-', '_')}", taken) for p in pools}
    for pool, reps in pools.items():
        name = upstream[pool]
        lines.append(f"    upstream {name} {{")
        lines.append(f"        zone {name} 64k;  # max_conns and max_fails shared by the workers")
        if (balance := _balance(g.policy.name)) is not None:
            lines.append(f"        {balance}")
        for r in reps:
            lines.append(
                f"        server {_upstream_host(r, local)}:{r.port}{cap} "
                f"max_fails={MAX_FAILS} fail_timeout={FAIL_TIMEOUT_S}s;"
                f"  # {r.name}, GPUs {','.join(map(str, r.gpu_ids))}"
            )
        lines.append("        keepalive 64;")
        lines.append("    }")
    default = "default" if "default" in pools else next(iter(pools))
    lines.append("    map $http_content_length $servefleet_pool {")
    lines.append(f"        default {upstream[default]};")
    if "long" in pools and default != "long":
        lines.append(
            f'        "~{at_least_regex(long_body_bytes)}" {upstream["long"]};'
            f"  # bodies of {long_body_bytes}+ bytes: ~{long_body_bytes // CHARS_PER_TOKEN}+ "
            "prompt tokens"
        )
    lines.append("    }")
    retry_after = (
        math.ceil(1 / g.rate_limit.requests_per_second) if g.rate_limit.requests_per_second else 1
    )
    generate = []  # the routes the gateway rate-limits: generation only
    if location_limits:
        generate = [
            "        location ~ ^/v1/(chat/)?completions$ {",
            *location_limits,
            "            proxy_pass http://$servefleet_pool;",
            "        }",
        ]
    lines += [
        "    server {",
        f"        listen {port};",
        "        proxy_http_version 1.1;",
        '        proxy_set_header Connection "";',
        "        proxy_set_header Host $host;",
        "        proxy_set_header X-Request-Id $request_id;",
        "        proxy_buffering off;            # stream tokens as they come",
        "        proxy_request_buffering on;     # the whole body first: needed to retry it",
        "        proxy_read_timeout 600s;",
        f"        proxy_connect_timeout {CONNECT_TIMEOUT_S}s;",
        "        # not yet reached an engine (refused, 502, 503 while loading): the next replica,",
        "        # POST included; nothing is retried once a byte went to the client",
        "        proxy_next_upstream error timeout http_502 http_503 non_idempotent;",
        f"        proxy_next_upstream_tries {RETRY_TRIES};",
        "        proxy_next_upstream_timeout 30s;",
        "        error_page 429 = @rate_limited;",
        "        error_page 502 = @no_replica;  # nginx's own 502: none free, or all failed",
        "        location = /nginx-health { return 200 'ok\\n'; }",
        "        location / { proxy_pass http://$servefleet_pool; }",
        *generate,
        _error_location(
            "@rate_limited",
            429,
            "rate_limit_exceeded",
            "Rate limit reached for this API key. Retry shortly.",
            retry_after,
        ),
        _error_location(
            "@no_replica",
            503,
            "replicas_full",
            "No replica can take the request now: all are at their cap or failing.",
            1,
        ),
        "    }",
        "}",
        "",
    ]
    return "\n".join(lines)
