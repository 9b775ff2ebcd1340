"""``servefleet gateway``: the command line. ``register(app)`` adds it to a Typer app."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
import yaml


def _set(data: dict[str, Any], dotted: str) -> None:
    key, sep, value = dotted.partition("=")
    if not sep or not key:
        raise typer.BadParameter(f"--set {dotted!r}: expected section.key=value")
    node = data
    parts = key.split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise typer.BadParameter(f"--set {dotted!r}: {p} is not a section")
    node[parts[-1]] = yaml.safe_load(value)


def _fleet_keys(data: dict) -> bool:
    return {"model", "gpus", "replicas"} <= data.keys()


def _is_fleet(path: Path) -> bool:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return False
    return isinstance(data, dict) and _fleet_keys(data)


def _reload_fleet(path: Path):
    from servefleet.gateway.config import parse_config

    return parse_config(_fleet_gateway(path), str(path))


def _fleet_gateway(path: Path) -> dict[str, Any]:
    """The gateway's config of a fleet.yaml, as `servefleet up` writes it: its ``gateway:``
    section and every replica (this host's on the loopback, the others' at host:port)."""
    from servefleet.fleet.commands import gateway_config
    from servefleet.gateway.config import ConfigError
    from servefleet.plan.fleet_yaml import load_fleet

    try:
        fleet = load_fleet(path)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return gateway_config(fleet, health_interval=None)


def build_config(
    config: Path | None,
    replica: list[str],
    policy: str | None,
    host: str | None,
    port: int | None,
    admin_token: str | None,
    log_level: str | None,
    settings: list[str],
):
    from servefleet.gateway.config import ConfigError, parse_config
    from servefleet.yaml_lines import compose, syntax_error

    data: dict[str, Any] = {}
    root = None
    if config is not None:
        try:
            text = config.read_text()
            loaded = yaml.safe_load(text)
        except OSError as exc:
            raise ConfigError(f"--config {config}: cannot read: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"--config {syntax_error(str(config), exc)}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"--config {config}: expected a mapping of settings")
        data = loaded or {}
        root = compose(text)
        if _fleet_keys(data):  # a fleet.yaml: its gateway section
            data, root = _fleet_gateway(config), None
    if replica:
        data["replicas"] = [*data.get("replicas", []), *({"url": u} for u in replica)]
    if policy:
        data.setdefault("policy", {})
        if isinstance(data["policy"], str):
            data["policy"] = {"name": data["policy"]}
        data["policy"]["name"] = policy
    elif isinstance(data.get("policy"), str):
        data["policy"] = {"name": data["policy"]}
    for k, v in (
        ("host", host),
        ("port", port),
        ("admin_token", admin_token),
        ("log_level", log_level),
    ):
        if v is not None:
            data[k] = v
    for s in settings:
        _set(data, s)
    cfg = parse_config(data, str(config) if config else "gateway settings", root)
    if not cfg.replicas and config is None:
        raise ConfigError("no replicas: give --replica URL (repeatable) or --config FILE")
    from servefleet.routing import make_policy

    try:
        make_policy(cfg.policy.name, **cfg.policy.options)
    except ValueError as exc:
        raise ConfigError(f"policy: {exc}") from None
    return cfg


def gateway(
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            help="YAML file (docs/gateway.md); SIGHUP or POST /admin/reload re-reads its replicas.",
        ),
    ] = None,
    replica: Annotated[
        list[str],
        typer.Option(
            "--replica", "-r", help="Replica base URL (repeatable), e.g. http://127.0.0.1:8000."
        ),
    ] = [],  # noqa: B006 (typer needs a literal default)
    policy: Annotated[
        str | None,
        typer.Option(
            help="Routing policy (servefleet.routing.POLICIES), default least-outstanding."
        ),
    ] = None,
    host: Annotated[
        str | None,
        typer.Option(
            help="Address to listen on (default 127.0.0.1). Beyond loopback, /fleet and "
            "/metrics need the admin token."
        ),
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="Port (default 8080; 0 picks a free one).")
    ] = None,
    admin_token: Annotated[
        str | None,
        typer.Option(
            envvar="SERVEFLEET_ADMIN_TOKEN",
            show_envvar=True,
            help="Enables /admin/* (and, beyond loopback, /fleet and /metrics) with "
            "`Authorization: Bearer TOKEN`. In containers, pass it in the environment (a "
            "Kubernetes Secret, a compose variable), never in a config file.",
        ),
    ] = None,
    log_level: Annotated[str | None, typer.Option(help="debug, info, warning or error.")] = None,
    settings: Annotated[
        list[str],
        typer.Option(
            "--set",
            help="Any setting as section.key=value (YAML value), e.g. --set health.interval=0.5 --set policy.options.load_factor=1.5.",
        ),
    ] = [],  # noqa: B006
) -> None:
    """An OpenAI-compatible gateway in front of vLLM replicas: routing policies, health
    checks, admission control, rate limits, retries and stream resumption, metrics."""
    from servefleet.gateway.config import ConfigError

    try:
        cfg = build_config(config, replica, policy, host, port, admin_token, log_level, settings)
    except ConfigError as exc:
        typer.echo(f"servefleet gateway: error: {exc}", err=True)
        raise typer.Exit(2) from None
    from servefleet.gateway.serve import serve

    if config is not None and _is_fleet(config):
        raise typer.Exit(serve(cfg, config, _reload_fleet))
    raise typer.Exit(serve(cfg, config))


def register(app: typer.Typer) -> None:
    """Add the ``gateway`` command to ``app``."""
    app.command("gateway")(gateway)


def main() -> None:
    app = typer.Typer(add_completion=False)
    register(app)
    app()
