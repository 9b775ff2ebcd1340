"""The sim-server: a simulated vLLM replica over HTTP (`servefleet sim-server`).

It speaks vLLM's OpenAI-compatible API (completions, chat, streaming, /tokenize, /metrics, ...)
and takes the timing of every engine step from the engine model, in wall-clock time, for a given
model on a given GPU. See docs/sim-server.md.

Entry points: ``parse_args(argv) -> SimServerArgs``, ``serve(args)``, ``main(argv)``,
``add_cli(typer_app)``; ``python -m servefleet.sim.server`` runs ``main``.
"""

from servefleet.sim.server.args import SimServerArgs, parse_args
from servefleet.sim.server.cli import add_cli, main


def serve(args: SimServerArgs) -> int:
    """Run the sim-server until SIGINT/SIGTERM (imports aiohttp only when called)."""
    from servefleet.sim.server.app import serve as _serve

    return _serve(args)


__all__ = ["SimServerArgs", "add_cli", "main", "parse_args", "serve"]
