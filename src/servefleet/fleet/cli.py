"""``servefleet up | status | down | export | demo``. ``register(app)`` adds them to a Typer app."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from servefleet import cli_options as opts

from .fleet_file import fail as _fail
from .fleet_file import load as _load

StateDir = Annotated[
    Path, typer.Option(help="Where `up` keeps its state file, pid file and per-replica logs.")
]
DEFAULT_STATE = Path(".servefleet")


def up(
    fleet_file: Annotated[
        Path, typer.Argument(help="fleet.yaml (`servefleet plan --out`).")
    ] = Path("fleet.yaml"),
    state_dir: StateDir = DEFAULT_STATE,
    time_scale: Annotated[
        float,
        typer.Option(
            callback=opts.POSITIVE,
            help="engine: sim — replicas run this many times faster than the GPU.",
        ),
    ] = 1.0,
    startup_time: Annotated[
        float | None,
        typer.Option(
            callback=opts.NON_NEGATIVE,
            help="engine: sim — seconds of model loading (default: predicted / scale).",
        ),
    ] = None,
    ready_timeout: Annotated[
        float, typer.Option(callback=opts.POSITIVE, help="Seconds a replica may take to be ready.")
    ] = 900.0,
    drain_timeout: Annotated[
        float,
        typer.Option(
            callback=opts.NON_NEGATIVE,
            help="Seconds to finish requests in flight on Ctrl-C / SIGTERM.",
        ),
    ] = 30.0,
    gpu_metrics_port: Annotated[
        int,
        typer.Option(
            help="engine: vllm — serve this host's GPUs' utilization, memory, power and SM "
            "clock (NVML, DCGM exporter names) at http://HOST:PORT/metrics, HOST where the "
            "gateway listens, for `servefleet bench`; 0: off."
        ),
    ] = 9400,
    this_host: Annotated[
        list[str],
        typer.Option(
            help="A name of this host in fleet.yaml's `host:` fields (repeatable; localhost and "
            "this machine's hostname always count). Replicas of other hosts are not started: "
            "the gateway joins them (docs/up.md)."
        ),
    ] = [],  # noqa: B006 (typer needs a literal default)
    gateway: Annotated[
        bool,
        typer.Option(
            "--gateway/--no-gateway",
            help="--no-gateway: only this host's replicas, for a gateway on another host.",
        ),
    ] = True,
) -> None:
    """Start the fleet of a fleet.yaml (vLLM or sim-server replicas + the gateway) and keep it
    running until Ctrl-C, SIGTERM or `servefleet down`. Across hosts: run it on each host;
    each starts its own replicas, one gateway joins them all."""
    from .commands import FleetError, SimOptions
    from .hosts import Placement
    from .supervisor import Supervisor, Timing

    if time_scale <= 0:
        _fail("--time-scale must be > 0")
    fleet = _load(fleet_file)
    err = Console(stderr=True)
    stop = threading.Event()

    def on_signal(signum, frame):
        stop.set()
        raise KeyboardInterrupt

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    sup = Supervisor(
        fleet,
        state_dir,
        sim=SimOptions(time_scale, startup_time),
        timing=Timing(ready_timeout=ready_timeout, drain_timeout=drain_timeout),
        say=lambda m: err.print(m, highlight=False),
        gpu_metrics_port=gpu_metrics_port,
        placement=(placement := Placement.here(tuple(this_host))),
        with_gateway=gateway,
    )
    n = len(placement.local(fleet))
    remote = len(fleet.replicas) - n
    try:
        with err.status(f"starting {n} {fleet.engine} replica(s) of {fleet.model.name}") as st:
            done = []

            def ready(name):
                done.append(name)
                err.print(f"  ready: {name}", highlight=False)
                st.update(
                    f"{len(done)}/{n + int(gateway)} ready (the gateway once a replica of each pool is)"
                )

            sup.start(on_ready=ready)
        Console().print(_up_message(n, remote, sup.gateway_url, state_dir), highlight=False)
        sup.supervise(stop)
    except KeyboardInterrupt:
        stop.set()
    except FleetError as e:
        _fail(str(e))
    finally:
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, signal.SIG_IGN)
        try:
            if sup.children():
                sup.shutdown()
                err.print("fleet stopped")
        finally:
            for s, h in old.items():
                signal.signal(s, h)


def _up_message(local: int, remote: int, gateway_url: str | None, state_dir: Path) -> str:
    where = (
        f"behind the gateway at [bold]{gateway_url}[/]"
        + (f" (with {remote} replica(s) of other hosts)" if remote else "")
        if gateway_url
        else "(no gateway here: another host's gateway joins them)"
    )
    return (
        f"fleet up: {local} replica(s) on this host {where} (logs in {state_dir}/logs; "
        "`servefleet status` / `servefleet down` from another terminal; Ctrl-C drains and stops)"
    )


def status(
    state_dir: StateDir = DEFAULT_STATE,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show the processes of a running `servefleet up` (alive, ready, restarts, logs)."""
    from rich.table import Table

    from .state import read_state, running_supervisor, status_rows

    state = read_state(state_dir)
    if state is None:
        _fail(f"no fleet state in {state_dir}: start one with `servefleet up`")
    pid = running_supervisor(state_dir)
    rows = status_rows(state) if pid else []
    if as_json:
        print(
            json.dumps(
                {"running": pid is not None, "supervisor_pid": pid, **state, "processes": rows}
            )
        )
        raise typer.Exit(0 if pid else 1)
    c = Console()
    if pid is None:
        c.print(f"no fleet running in {state_dir} (last phase: {state.get('phase')})")
        raise typer.Exit(1)
    gw = state.get("gateway_url") or "none here (--no-gateway)"
    c.print(
        f"fleet {state['phase']}: {state['model']} ({state['engine']}), gateway {gw}, supervisor pid {pid}"
    )
    t = Table(header_style="bold")
    for h in ("process", "pid", "port", "alive", "ready", "restarts", "log"):
        t.add_column(h)
    for r in rows:
        t.add_row(
            r["name"],
            str(r["pid"]),
            str(r["port"]),
            "yes" if r["alive"] else "[red]no[/]",
            "yes" if r["ready"] else "[yellow]no[/]",
            str(r["restarts"]),
            r["log"],
        )
    c.print(t)
    if remote := state.get("remote_replicas"):
        joined = ", ".join(f"{r['name']} ({r['url']})" for r in remote)
        c.print(f"replicas of other hosts, joined by the gateway: {joined}", highlight=False)


def down(
    state_dir: StateDir = DEFAULT_STATE,
    timeout: Annotated[
        float, typer.Option(callback=opts.NON_NEGATIVE, help="Seconds to wait for the drain.")
    ] = 60.0,
) -> None:
    """Drain and stop the fleet that `servefleet up` runs (from another terminal)."""
    from .state import down as do_down

    Console().print(do_down(state_dir, timeout), highlight=False)


def register(app: typer.Typer) -> None:
    """Add ``up``, ``status``, ``down``, ``export`` and ``demo`` to ``app``."""
    from .demo import demo
    from .export_cli import export_app

    app.command()(up)
    app.command()(status)
    app.command()(down)
    app.command()(demo)
    app.add_typer(export_app(), name="export")
