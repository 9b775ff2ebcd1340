"""``python -m servefleet.bench ...``: the bench and report commands without the main CLI."""

from __future__ import annotations

import typer

from servefleet.bench.cli import register as register_bench
from servefleet.report.cli import register as register_report


def build_app() -> typer.Typer:
    app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
    register_bench(app)
    register_report(app)
    return app


def main() -> None:
    build_app()()


if __name__ == "__main__":
    main()
