"""``servefleet export nginx|compose|k8s``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

FleetFile = Annotated[Path, typer.Argument(help="fleet.yaml")]
Out = Annotated[Path | None, typer.Option("--out", "-o", help="Write here instead of stdout.")]
GatewayImage = Annotated[
    str | None,
    typer.Option(
        help="Image of the gateway (and of sim-server replicas); default servefleet:<version>, "
        "as `docker build -t servefleet:<version> .` in the repository makes it."
    ),
]


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
        """nginx.conf in place of the gateway: retries before the first byte (POST too), the cap
        per replica (max_conns), per-user request limits (limit_req), the long pool by body size,
        passive health; its comments say what only the gateway does."""
        from .export import nginx_conf

        _emit(nginx_conf(load(fleet_file), listen=listen), out)

    @app.command()
    def compose(
        fleet_file: FleetFile = Path("fleet.yaml"),
        out: Out = None,
        gateway_image: GatewayImage = None,
    ) -> None:
        """docker-compose.yaml: a service per replica pinned to its GPUs, health checks, and the
        gateway with each replica, its pool and the cap (plus Redis for per-user limits)."""
        from .export import compose as render
        from .export_compose import ComposeError

        try:
            text = render(load(fleet_file), gateway_image=gateway_image)
        except ComposeError as e:
            from .cli import _fail

            _fail(str(e))
        _emit(text, out)

    @app.command()
    def k8s(
        fleet_file: FleetFile = Path("fleet.yaml"),
        out: Out = None,
        hosts: Annotated[
            int | None,
            typer.Option(
                help="Nodes: a one-host fleet.yaml is repeated on N nodes of gpus.count GPUs "
                "(default: the hosts fleet.yaml lists)."
            ),
        ] = None,
        gateways: Annotated[
            int, typer.Option(help="Gateway pods (each admits cap // gateways per replica).")
        ] = 2,
        gateway_image: GatewayImage = None,
        weights_host_path: Annotated[
            str | None,
            typer.Option(
                help="Keep the weights in this directory of each node (hostPath) instead of a "
                "PersistentVolumeClaim per replica pod."
            ),
        ] = None,
        storage_class: Annotated[
            str | None,
            typer.Option(
                help="StorageClass of the weights' PersistentVolumeClaims (default: the "
                "cluster's default class)."
            ),
        ] = None,
    ) -> None:
        """Kubernetes: a StatefulSet + headless Service per replica group (GPU requests, node
        selector, probes, the weights on a PersistentVolumeClaim, HF_TOKEN from a Secret),
        gateways that discover every replica pod, Redis for per-user limits, RBAC, and
        NetworkPolicies that admit only the gateway to the replicas."""
        from .export import k8s as render
        from .export_k8s import HostsError

        fleet = load(fleet_file)
        try:
            text = render(
                fleet,
                hosts=hosts,
                gateways=gateways,
                gateway_image=gateway_image,
                weights_host_path=weights_host_path,
                storage_class=storage_class,
            )
        except (HostsError, ValueError) as e:
            from .cli import _fail

            _fail(str(e))
        _emit(text, out)

    return app
