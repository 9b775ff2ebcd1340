"""``servefleet export nginx|compose|k8s``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

FleetFile = Annotated[Path, typer.Argument(help="fleet.yaml")]
Out = Annotated[Path | None, typer.Option("--out", "-o", help="Write here instead of stdout.")]


def _emit(text: str, out: Path | None) -> None:
    if out is None:
        typer.echo(text, nl=False)
    else:
        out.write_text(text)
        typer.echo(f"wrote {out}", err=True)


def export_app() -> typer.Typer:
    app = typer.Typer(
        help="Export a fleet.yaml as nginx.conf, docker-compose or Kubernetes.",
        no_args_is_help=True,
    )

    def load(path: Path):
        from .cli import _load

        return _load(path)

    @app.command()
    def nginx(
        fleet_file: FleetFile = Path("fleet.yaml"),
        out: Out = None,
        listen: Annotated[
            int | None, typer.Option(help="Port Nginx listens on (default: gateway.port).")
        ] = None,
    ) -> None:
        """nginx.conf: consistent hash on X-Session-Id, passive health, keep-alive, long pool."""
        from .export import nginx_conf

        _emit(nginx_conf(load(fleet_file), listen=listen), out)

    @app.command()
    def compose(fleet_file: FleetFile = Path("fleet.yaml"), out: Out = None) -> None:
        """docker-compose.yaml: a service per replica pinned to its GPUs, health checks, gateway."""
        from .export import compose as render

        _emit(render(load(fleet_file)), out)

    @app.command()
    def k8s(fleet_file: FleetFile = Path("fleet.yaml"), out: Out = None) -> None:
        """Kubernetes Deployments + Services per replica group (GPU requests, readiness probes)."""
        from .export import k8s as render

        _emit(render(load(fleet_file)), out)

    return app
