"""The sim-server's command line: ``servefleet sim-server`` and ``python -m servefleet.sim.server``
(flags parsed by ``args.parse_args``, served by ``app.serve``)."""

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from servefleet.sim.server.args import ArgsError, parse_args

if TYPE_CHECKING:
    import typer


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, then serve until SIGINT/SIGTERM. Returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parse_args(argv)
    except ArgsError as exc:
        print(f"servefleet sim-server: error: {exc}", file=sys.stderr)
        return 2
    from servefleet.sim.server.app import serve  # aiohttp only when serving

    return serve(args)


def add_cli(app: "typer.Typer") -> None:
    """Register ``sim-server`` on the servefleet Typer app; its flags are parsed by
    ``parse_args`` (vLLM's names, so they cannot be typer options), ``--help`` included."""
    import typer

    @app.command(
        "sim-server",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        add_help_option=False,
        help="A simulated vLLM replica over HTTP (vllm serve's flags; --help lists them).",
    )
    def sim_server(ctx: typer.Context) -> None:  # evaluated by typer: typer is a local here
        raise typer.Exit(main(list(ctx.args)))
