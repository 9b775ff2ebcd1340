"""GET a small text resource (``/metrics``, ``/fleet``, ``/version``) with the bench's session.

The bench's session does not decompress (``auto_decompress=False``: a response's bytes are timed
as they arrive), and prometheus_client's HTTP server gzips ``/metrics`` for any client that
accepts it — aiohttp's default ``Accept-Encoding``. So ask for ``identity``, and still undo a
gzip body should a server send one anyway.

A servefleet gateway listening beyond loopback shows ``/fleet`` and ``/metrics`` only with its
admin token (``Authorization: Bearer <token>``): 403 when it has none set, 401 when the request
lacks it. Callers pass ``token`` for the target's own URLs only, never to other hosts (the
replicas, a GPU exporter); ``refusal`` turns such an answer into one line saying what to pass.
"""

from __future__ import annotations

import gzip
import json
import zlib

import aiohttp

HEADERS = {"Accept-Encoding": "identity"}


async def get_text(
    session: aiohttp.ClientSession, url: str, timeout: float = 5.0, token: str | None = None
) -> tuple[int, str]:
    """(status, body as text); aiohttp's errors and TimeoutError propagate. ``token``: sent as
    ``Authorization: Bearer``."""
    headers = HEADERS if token is None else {**HEADERS, "Authorization": f"Bearer {token}"}
    async with session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout)) as r:
        body = await r.read()
        enc = r.headers.get("Content-Encoding", "").lower()
        if enc == "gzip" or body[:2] == b"\x1f\x8b":
            body = gzip.decompress(body)
        elif enc == "deflate":
            body = zlib.decompress(body)
        return r.status, body.decode("utf-8", "replace")


async def get_json(
    session: aiohttp.ClientSession, url: str, timeout: float = 5.0, token: str | None = None
):
    """(status, parsed JSON or None when the body is not JSON)."""
    status, text = await get_text(session, url, timeout, token)
    try:
        return status, json.loads(text)
    except ValueError:
        return status, None


def refusal(status: int, url: str, token: str | None) -> str | None:
    """What to pass, in one line, when ``url`` (a gateway's ``/fleet`` or ``/metrics``) refused
    the bench for want of the admin token; None for any other status."""
    if status == 403:
        return (
            f"{url} answered 403: a servefleet gateway listening beyond loopback shows its "
            "replicas and metrics only with an admin token, and this one has none: start it "
            "with --admin-token TOKEN (or SERVEFLEET_ADMIN_TOKEN) and give servefleet bench the "
            "same --admin-token; the server's metrics are not read meanwhile"
        )
    if status == 401:
        why = "refused the admin token given" if token else "wants the gateway's admin token"
        return (
            f"{url} answered 401: it {why}: pass it with --admin-token TOKEN (or "
            "SERVEFLEET_ADMIN_TOKEN); the server's metrics are not read meanwhile"
        )
    return None
