"""``servefleet export nginx``: nginx in place of the servefleet gateway, keeping what nginx can
keep of the gateway's protections (docs/export.md).

Rule, what maps to what:

* retry before the first byte (gateway: ``retry``) -> ``proxy_next_upstream error timeout
  http_502 http_503 non_idempotent``: a POST answered 502/503 or refused at connect has not
  reached an engine, so it goes to the next replica; nginx retries only while nothing has been
  sent to the client.
* the cap per replica (``gateway.max_in_flight_per_replica``) -> ``max_conns`` in an upstream
  ``zone`` (without the zone each worker process would count alone).
* API keys (``gateway.auth.keys_file``) -> a key's SHA-256 (njs, ``servefleet.js``) looked up
  in ``servefleet-keys.map`` (made from the keys file, beside nginx.conf): a known key is its
  name and tier, an unknown one the client's address (``auth.required``: 401).
* per-user limits (``gateway.rate_limit``, its ``tiers``) -> ``limit_req`` per tier, keyed by
  the verified key's name (the address without one); without a keys file, keyed by the
  ``Authorization`` header and bounded per address (``users_per_address``).
* routes -> only the gateway's OpenAI routes are proxied (``/v1/completions`` and
  ``/v1/chat/completions`` under the limits, ``/v1/models``); any other path is 404 at nginx.
* address -> ``listen`` on ``gateway.host`` only.
* length pools -> the request body's size (``Content-Length``), the one sign of prompt length
  nginx sees without reading the body.
* health -> passive: ``max_fails``/``fail_timeout``, as many failures as the gateway's
  ``health.unhealthy_threshold``.
* policy -> ``hash`` on the session header for the affinity policies, ``least_conn`` for the
  load-based ones, round robin for ``round-robin``.
"""

from __future__ import annotations

import math
import re

from servefleet.gateway.config import GatewayConfig, RateLimitConfig
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


def _burst(extra: int) -> str:
    """nginx's ``burst=N `` parameter (none for 0: nginx refuses ``burst=0``)."""
    return f"burst={extra} " if extra > 0 else ""


def _nginx_rate(rps: float) -> str:
    """nginx takes whole requests per second or per minute."""
    if rps >= 1 and float(rps).is_integer():
        return f"{int(rps)}r/s"
    return f"{max(1, round(rps * 60))}r/m"


def _limits_without_keys(limit: RateLimitConfig) -> tuple[list[str], list[str]]:
    """(http-level lines, location-level lines) of the per-user request limit when nginx has no
    keys file: the user is the Authorization header, bounded per address."""
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
        "    # nginx does not verify API keys without auth.keys_file: an invented key would get a",
        f"    # fresh bucket, so every address is also held to {shared} users' worth (NAT, an app",
        "    # server)",
        "    limit_req_zone $binary_remote_addr zone=per_address:10m "
        f"rate={_nginx_rate(rps * shared)};",
        "    limit_req_status 429;",
    ], [
        # nginx lets burst + 1 through at once; the gateway's bucket holds `burst`
        f"            limit_req zone=per_user {_burst(burst - 1)}nodelay;"
        f"  # {rps:g} requests/s, {burst} at once",
        f"            limit_req zone=per_address {_burst(burst * shared - 1)}nodelay;",
    ]


KEYS_JS = "servefleet.js"
KEYS_MAP = "servefleet-keys.map"
JS_MODULE = "/usr/lib/nginx/modules/ngx_http_js_module.so"
"""Debian's ``libnginx-mod-http-js``; nginx's own images have it at
``/etc/nginx/modules/ngx_http_js_module.so`` (``--njs-module``)."""

KEY_SHA256_JS = """\
// The SHA-256 (hex) of the request's bearer key, as the gateway's keys file stores it
// (generated by `servefleet export nginx`).
const crypto = require("crypto");

function key_sha256(r) {
    const auth = r.headersIn["Authorization"] || "";
    if (auth.slice(0, 7).toLowerCase() !== "bearer ") {
        return "";
    }
    return crypto.createHash("sha256").update(auth.slice(7).trim()).digest("hex");
}

export default { key_sha256 };
"""


def keys_map(keys_file: str) -> str:
    """``servefleet-keys.map``: each key's SHA-256 -> "NAME TIER", from the gateway's keys file
    (the same file, the same rule: gateway/identity.py)."""
    from servefleet.gateway.identity import load_keys

    lines = [f"# from {keys_file} by `servefleet export nginx`; re-export when it changes"]
    for sha, entry in sorted(load_keys(keys_file).items()):
        lines.append(f'{sha} "{_safe(entry.name)} {_safe(entry.tier)}";')
    return "\n".join(lines) + "\n"


def _safe(word: str) -> str:
    """A key's name or tier as one nginx word (what cannot be in it becomes `_`)."""
    return re.sub(r"[^A-Za-z0-9._:@-]", "_", word) or "_"


def _limits_with_keys(g: GatewayConfig) -> tuple[list[str], list[str]]:
    """(http-level lines, location-level lines) of verified keys and per-tier limits."""
    http = [
        "    # API keys: the bearer key's SHA-256 (njs), looked up in the keys map",
        f"    js_import servefleet from {KEYS_JS};",
        "    js_set $servefleet_key_sha256 servefleet.key_sha256;",
        f'    map $servefleet_key_sha256 $servefleet_key {{ default ""; include {KEYS_MAP}; }}',
        '    map $servefleet_key $servefleet_user { "~^(?<kname>\\S+) " "key:$kname"; '
        "default $binary_remote_addr; }",
    ]
    rl = g.rate_limit
    # a tier rate_limit.tiers does not list has the default limits, as at the gateway
    known = "".join(
        f'"~ {re.escape(_safe(t))}$" "tier:{_safe(t)}"; ' for t in rl.tiers if t != "default"
    )
    http.append(f"    map $servefleet_key $servefleet_tier {{ {known}default tier:default; }}")
    location: list[str] = []
    if g.auth.required:
        location.append('            if ($servefleet_key = "") { return 401; }  # auth.required')
    tiers = {"default": rl, **{t: lim for t, lim in rl.tiers.items() if t != "default"}}
    zones = []
    for tier, lim in tiers.items():
        if lim.requests_per_second is None:
            continue
        zone = f"tier_{re.sub(r'[^a-z0-9]+', '_', tier.lower())}_{len(zones)}"
        zones.append(zone)
        rps = lim.requests_per_second
        burst = math.floor(lim.request_burst or max(1, rps))
        http += [
            f'    map $servefleet_tier ${zone} {{ "tier:{_safe(tier)}" $servefleet_user; default ""; }}',
            f"    limit_req_zone ${zone} zone={zone}:10m rate={_nginx_rate(rps)};",
        ]
        # nginx lets burst + 1 through at once; the gateway's bucket holds `burst`
        location.append(
            f"            limit_req zone={zone} {_burst(burst - 1)}nodelay;"
            f"  # tier {tier}: {rps:g} requests/s, {burst} at once"
        )
    if zones:
        http.append("    limit_req_status 429;")
    else:
        http.append("    # no per-user request limit: set gateway.rate_limit in fleet.yaml")
    return http, location


def _error_location(name: str, status: int, code: str, message: str, retry_after: int) -> str:
    kind = {429: "rate_limit_error", 401: "authentication_error"}.get(status, "server_error")
    body = (
        f'{{"error": {{"message": "{message}", "type": "{kind}", "param": null, '
        f'"code": "{code}"}}}}'
    )
    retry = f"add_header Retry-After {retry_after} always; " if retry_after else ""
    return (
        f"        location {name} {{ default_type application/json; "
        f"{retry}return {status} '{body}'; }}"
    )


def _upstream_host(r: Replica, local: bool) -> str:
    return "127.0.0.1" if local or r.host in LOCAL_HOSTS else r.host


def nginx_files(
    fleet: Fleet,
    *,
    listen: int | None = None,
    local: bool = False,
    long_body_bytes: int = LONG_PROMPT_TOKENS * CHARS_PER_TOKEN,
    njs_module: str = JS_MODULE,
) -> dict[str, str]:
    """nginx.conf and, with API keys, the two files it reads beside it (the njs module that
    hashes a key, the keys map): file name -> text."""
    files = {"nginx.conf": nginx_conf(fleet, listen=listen, local=local,
                                      long_body_bytes=long_body_bytes, njs_module=njs_module)}  # fmt: skip
    if fleet.gateway.auth.keys_file is not None:
        files[KEYS_JS] = KEY_SHA256_JS
        files[KEYS_MAP] = keys_map(fleet.gateway.auth.keys_file)
    return files


def _listen(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def nginx_conf(
    fleet: Fleet,
    *,
    listen: int | None = None,
    local: bool = False,
    long_body_bytes: int = LONG_PROMPT_TOKENS * CHARS_PER_TOKEN,
    njs_module: str = JS_MODULE,
) -> str:
    """A complete nginx.conf for `fleet` (run it with `nginx -p DIR -c nginx.conf`; with API
    keys, beside the other files of ``nginx_files``)."""
    port = listen if listen is not None else fleet.gateway.port
    g = fleet.gateway
    keys = g.auth.keys_file is not None
    pools: dict[str, list[Replica]] = {}
    for r in fleet.replicas:
        pools.setdefault(r.pool, []).append(r)
    cap = f" max_conns={g.max_in_flight_per_replica}" if g.max_in_flight_per_replica else ""
    if keys:
        http_limits, location_limits = _limits_with_keys(g)
    else:
        http_limits, location_limits = _limits_without_keys(g.rate_limit)
    lines = [
        "# nginx.conf — generated by `servefleet export nginx` from fleet.yaml (docs/export.md)",
        CANNOT,
        *([f"load_module {njs_module};  # njs: the API keys' SHA-256"] if keys else []),
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
        *(["    map_hash_bucket_size 128;  # the keys map: 64 hex digits a key"] if keys else []),
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
    required = (
        ['            if ($servefleet_key = "") { return 401; }  # auth.required']
        if keys and g.auth.required
        else []
    )
    routes = [  # the gateway's OpenAI routes, each under the identity and limits, as there
        "        location = /v1/completions {",
        *location_limits,
        "            proxy_pass http://$servefleet_pool;",
        "        }",
        "        location = /v1/chat/completions {",
        *location_limits,
        "            proxy_pass http://$servefleet_pool;",
        "        }",
        "        location = /v1/models {",
        *([] if "/v1/models" in g.auth.open_routes else location_limits),
        "            proxy_pass http://$servefleet_pool;",
        "        }",
        # nothing else reaches a replica: /metrics, /tokenize, /v1/embeddings, /invocations...
        '        location / { default_type application/json; return 404 \'{"error": {"message": '
        '"Unknown route.", "type": "invalid_request_error", "param": null, "code": '
        '"not_found"}}\'; }',
    ]
    lines += [
        "    server {",
        f"        listen {_listen(g.host, port)};  # gateway.host",
        "        proxy_http_version 1.1;",
        '        proxy_set_header Connection "";',
        "        proxy_set_header Host $host;",
        "        proxy_set_header X-Request-Id $request_id;",
        *(
            []
            if g.auth.forward_client_key
            else ['        proxy_set_header Authorization "";  # a client\'s key stays here']
        ),
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
        *(["        error_page 401 = @unauthorized;"] if required else []),
        "        location = /nginx-health { return 200 'ok\\n'; }",
        *routes,
        _error_location(
            "@rate_limited",
            429,
            "rate_limit_exceeded",
            "Rate limit reached for this API key. Retry shortly.",
            retry_after,
        ),
        *(
            [
                _error_location(
                    "@unauthorized",
                    401,
                    "invalid_api_key",
                    "Incorrect or missing API key: give `Authorization: Bearer <key>`.",
                    0,
                )
            ]
            if required
            else []
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
