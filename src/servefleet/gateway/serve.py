"""Running the gateway as a process: listen, print a ready line, drain on SIGTERM/SIGINT,
reload the config file on SIGHUP."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import ipaddress
import json
import logging
import signal
from collections.abc import Callable
from http import HTTPStatus
from pathlib import Path

from aiohttp import web
from aiohttp.http_exceptions import LineTooLong
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_server import Server

from servefleet.gateway.admission import PerClient
from servefleet.gateway.app import Gateway
from servefleet.gateway.config import GatewayConfig, ServerConfig, load_config
from servefleet.gateway.errors import GatewayError
from servefleet.gateway.log import configure_logging, event

Loader = Callable[[Path], GatewayConfig]
"""How a reload reads the config file."""


def ready_line(gw: Gateway, host: str, port: int) -> str:
    return (
        f"servefleet gateway ready: listening on http://{host}:{port} port={port} "
        f"policy={gw.policy.name} replicas={len(gw.replicas)}"
    )


class ConnectionLimits:
    """What one client connection may hold, checked before any handler runs: connections per
    address (``PerClient``; trusted proxies exempt) and bytes of a request head."""

    def __init__(self, cfg: ServerConfig, trusted: list[str]) -> None:
        self.max_head_bytes = cfg.max_head_bytes
        self.per_address = PerClient(cfg.max_connections_per_address)
        self._trusted = [ipaddress.ip_network(t, strict=False) for t in trusted]

    def exempt(self, addr: str) -> bool:
        try:
            ip = ipaddress.ip_address(addr)
        except ValueError:
            return False
        return any(ip in net for net in self._trusted)


def refusal(status: int, code: str, message: str) -> bytes:
    """A whole HTTP/1.1 answer that closes the connection (written before aiohttp's parser
    has a request to answer)."""
    body = json.dumps(GatewayError(status, message, code).body()).encode()
    reason = HTTPStatus(status).phrase
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


class _JsonErrors(RequestHandler):
    """aiohttp's connection handler, whose own errors (a malformed request line or header,
    an oversized head: answered before any handler runs) are OpenAI-shaped JSON too, and
    which holds a connection to ``ConnectionLimits``: one address over its connection cap
    gets 429, a head over ``max_head_bytes`` (or over aiohttp's per-line and header-count
    limits) 431, and the connection is closed."""

    def __init__(self, *args, limits: ConnectionLimits, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits
        self.peer: str | None = None
        """The address counted against its connection cap (None: not counted)."""
        self.head_bytes = 0
        """Bytes received towards the request head being read."""
        self.body = None
        """The last request's body (a head is awaited once it is complete)."""

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        addr = peer[0] if isinstance(peer, tuple) and peer else None
        if addr is None or self.limits.exempt(addr):
            return
        if not self.limits.per_address.enter(addr):
            cap = self.limits.per_address.cap
            self.refuse(429, "too_many_connections",
                        f"{addr} has {cap} connections open already "
                        "(server.max_connections_per_address).")  # fmt: skip
            return
        self.peer = addr

    def connection_lost(self, exc) -> None:
        if self.peer is not None:
            self.limits.per_address.leave(self.peer)
            self.peer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._force_close or self._close:
            return
        awaiting = self.body is None or self.body.is_eof()
        n = self._request_count
        super().data_received(data)
        if self._request_count != n:
            self.head_bytes = 0
            if self._messages:
                self.body = self._messages[-1][1]
        elif awaiting:
            self.head_bytes += len(data)
            if self.head_bytes > self.limits.max_head_bytes:
                self.refuse(431, "head_too_large",
                            f"The request head is larger than {self.limits.max_head_bytes} "
                            "bytes (server.max_head_bytes).")  # fmt: skip

    def refuse(self, status: int, code: str, message: str) -> None:
        tr = self.transport
        if tr is not None and not tr.is_closing():
            tr.write(refusal(status, code, message))
        self.force_close()  # closes the transport once the answer is out

    def handle_error(self, request, status=500, exc=None, message=None) -> web.StreamResponse:
        if request.writer.output_size > 0:
            return super().handle_error(request, status, exc, message)
        reason = message or (exc.__class__.__name__ if exc is not None else "error")
        code = "bad_http"
        if isinstance(exc, LineTooLong) or "too many headers" in str(reason).lower():
            status, code = 431, "head_too_large"  # a header line, or too many of them
        resp = GatewayError(status, f"Bad HTTP request: {reason}"[:300], code).response()
        resp.force_close()
        return resp


class _JsonErrorServer(Server):
    limits: ConnectionLimits

    def __call__(self) -> RequestHandler:
        return _JsonErrors(self, loop=self._loop, limits=self.limits, **self._kwargs)


class _Runner(web.AppRunner):
    def __init__(self, app: web.Application, limits: ConnectionLimits, **kwargs) -> None:
        super().__init__(app, **kwargs)
        self.limits = limits

    async def _make_server(self) -> Server:
        server = await super()._make_server()
        server.__class__ = _JsonErrorServer  # same state; only the handler class differs
        server.limits = self.limits  # type: ignore[attr-defined]
        return server


async def run_gateway(
    cfg: GatewayConfig, config_path: Path | None = None, loader: Loader = load_config
) -> None:
    gw = Gateway(cfg, config_path, loader)
    sc = cfg.server
    runner = _Runner(
        gw.build_app(),
        ConnectionLimits(sc, cfg.auth.trusted_proxies),
        max_headers=sc.max_header_count,
        max_field_size=sc.max_header_line,
        max_line_size=sc.max_header_line,
        handler_cancellation=True,
        access_log=None,
        shutdown_timeout=1.0,
        # also the time a new connection has to send a whole request head: aiohttp closes a
        # connection whose head is incomplete when this runs out (slow-header clients)
        keepalive_timeout=cfg.server.header_timeout,
    )
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    reloads: set[asyncio.Task] = set()

    async def reload() -> None:
        try:
            await gw.reload()
        except GatewayError as exc:
            event(logging.ERROR, "config_reload_failed", why=exc.message)

    def on_hup() -> None:
        t = loop.create_task(reload())
        reloads.add(t)
        t.add_done_callback(reloads.discard)

    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    with contextlib.suppress(NotImplementedError, RuntimeError, AttributeError):
        loop.add_signal_handler(signal.SIGHUP, on_hup)
    try:
        site = web.TCPSite(runner, cfg.host, cfg.port, backlog=4096)
        await site.start()
        port = runner.addresses[0][1] if runner.addresses else cfg.port
        settle_gc()
        print(ready_line(gw, cfg.host, port), flush=True)
        event(logging.INFO, "listening", host=cfg.host, port=port, policy=gw.policy.name)
        await stop.wait()
        clean = await gw.drain(cfg.drain_timeout)
        event(logging.INFO, "drained", clean=clean, in_flight=gw.in_flight)
    finally:
        for t in list(reloads):
            t.cancel()
        await runner.cleanup()


def settle_gc() -> None:
    """Move everything made while starting (modules, the app, the config) out of the
    collector's reach. Otherwise the first full collections under load walk all of it: a
    50 ms pause of every stream (measured at 200 streams), where the collections that
    remain walk only what requests made, a few ms."""
    gc.collect()
    gc.freeze()


def serve(cfg: GatewayConfig, config_path: Path | None = None, loader: Loader = load_config) -> int:
    configure_logging(cfg.log_level)
    gc.freeze()
    try:
        import uvloop

        uvloop.run(run_gateway(cfg, config_path, loader))
    except ImportError:
        asyncio.run(run_gateway(cfg, config_path, loader))
    return 0
