"""The live progress display: a rich panel on stderr, refreshed a few times a second."""

from __future__ import annotations

import sys

import numpy as np
from rich.console import Console
from rich.live import Live
from rich.table import Table

from servefleet.bench.point import LiveStats


def render(live: LiveStats, point: str) -> Table:
    t = Table.grid(padding=(0, 2))
    planned = f" / {live.planned:g} s" if live.planned else ""
    ttft = np.percentile(list(live.ttfts), 50) if live.ttfts else None
    t.add_row(
        f"[bold]{point}[/] {live.label}",
        f"{live.elapsed:5.1f} s{planned}",
        f"sent {live.sent}",
        f"in flight {live.in_flight}",
        f"done {live.done}",
        f"[red]errors {live.errors}[/]" if live.errors else "errors 0",
        f"{live.token_rate():,.0f} tok/s",
        f"TTFT p50 {ttft * 1000:,.0f} ms" if ttft is not None else "TTFT p50 -",
    )
    if live.last_error:
        t.add_row(f"[red]last error:[/] {live.last_error[:120]}")
    return t


class Display:
    """``start()``/``stop()``; ``point(i, n)`` names the point being run."""

    def __init__(
        self, live: LiveStats, enabled: bool | None = None, console: Console | None = None
    ):
        self.stats = live
        self.console = console or Console(stderr=True)
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._live: Live | None = None
        self._point = ""

    def point(self, i: int, n: int | None) -> None:
        self._point = f"point {i + 1}" + (f"/{n}" if n else "")

    def start(self) -> None:
        if self.enabled:
            self._live = Live(
                get_renderable=lambda: render(self.stats, self._point),
                console=self.console,
                refresh_per_second=4,
                transient=True,
            )
            self._live.start()

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
