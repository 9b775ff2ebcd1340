"""Small aiohttp helpers shared by the gateway and the sim-server."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web


def bind_lifecycle(
    app: web.Application,
    start: Callable[[], Awaitable[None]],
    stop: Callable[[], Awaitable[None]],
) -> web.Application:
    """Await ``start()`` when ``app`` starts up and ``stop()`` when it is cleaned up (the
    runner's ``setup()`` and ``cleanup()``, or ``web.run_app``); returns ``app``."""

    async def on_startup(_app: web.Application) -> None:
        await start()

    async def on_cleanup(_app: web.Application) -> None:
        await stop()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app
