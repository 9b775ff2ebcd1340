"""``servefleet export nginx|compose|k8s``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .export_nginx import JS_MODULE
from .fleet_file import fail, load

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

    @app.command()
    def nginx(
        fleet_file: FleetFile = Path("fleet.yaml"),
        out: Out = None,
        listen: Annotated[
            int | None,
            typer.Option(help="Port Nginx listens on, on gateway.host (default: gateway.port)."),
        ] = None,
        njs_module: Annotated[
            str,
            typer.Option(
                help="With API keys: nginx's njs module, which hashes a key (Debian's "
                "libnginx-mod-http-js; nginx's images: /etc/nginx/modules/ngx_http_js_module.so)."
            ),
        ] = JS_MODULE,
    ) -> None:
        """nginx.conf in place of the gateway: only the OpenAI routes, retries before the first
        byte (POST too), the cap per replica (max_conns), API keys and per-tier request limits
        (limit_req), the long pool by body size, passive health; its comments say what only the
        gateway does. With API keys (gateway.auth.keys_file), servefleet.js and
        servefleet-keys.map are written beside --out."""
        from .export_nginx import nginx_files

        files = nginx_files(load(fleet_file), listen=listen, njs_module=njs_module)
        if len(files) > 1:
            if out is None:
                fail(
                    f"the API keys need {', '.join(list(files)[1:])} beside nginx.conf: "
                    "give --out FILE (they are written in its directory)"
                )
            for name, text in list(files.items())[1:]:
                _emit(text, out.parent / name)
        _emit(files["nginx.conf"], out)

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
            fail(str(e))
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
            fail(str(e))
        _emit(text, out)

    return app
