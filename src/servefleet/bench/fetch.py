"""GET a small text resource (``/metrics``, ``/fleet``, ``/version``) with the bench's session.

The bench's session does not decompress (``auto_decompress=False``: a response's bytes are timed
as they arrive), and prometheus_client's HTTP server gzips ``/metrics`` for any client that
accepts it — aiohttp's default ``Accept-Encoding``. So ask for ``identity``, and still undo a
gzip body should a server send one anyway.
"""

from __future__ import annotations

import gzip
import json
import zlib

import aiohttp

HEADERS = {"Accept-Encoding": "identity"}


async def get_text(
    session: aiohttp.ClientSession, url: str, timeout: float = 5.0
) -> tuple[int, str]:
    """(status, body as text); aiohttp's errors and TimeoutError propagate."""
    async with session.get(url, headers=HEADERS, timeout=aiohttp.ClientTimeout(total=timeout)) as r:
        body = await r.read()
        enc = r.headers.get("Content-Encoding", "").lower()
        if enc == "gzip" or body[:2] == b"\x1f\x8b":
            body = gzip.decompress(body)
        elif enc == "deflate":
            body = zlib.decompress(body)
        return r.status, body.decode("utf-8", "replace")


async def get_json(session: aiohttp.ClientSession, url: str, timeout: float = 5.0):
    """(status, parsed JSON or None when the body is not JSON)."""
    status, text = await get_text(session, url, timeout)
    try:
        return status, json.loads(text)
    except ValueError:
        return status, None
