"""Reading the fleet.yaml a command names, and failing the way every fleet command fails: one
line on stderr, exit code 2 (shared by ``up``/``status``/``down`` and ``export``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import typer
from rich.console import Console

if TYPE_CHECKING:
    from servefleet.plan.fleet_yaml import Fleet


def fail(msg: str) -> NoReturn:
    Console(stderr=True).print(f"[bold red]error:[/] {msg}", highlight=False)
    raise typer.Exit(2)


def load(path: Path) -> Fleet:
    """The fleet of ``path`` (a fleet.yaml, or the ``--out`` folder of `servefleet plan`)."""
    from servefleet.plan.fleet_yaml import load_fleet

    if path.is_dir():
        path = path / "fleet.yaml"
    try:
        return load_fleet(path)
    except ValueError as e:
        fail(str(e))
