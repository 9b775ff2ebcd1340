"""`servefleet report show|html|compare`: re-render any run from its records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from servefleet import cli_options as opts

console = Console()
err = Console(stderr=True)


def _fail(msg: str) -> None:
    err.print(f"[bold red]error:[/] {msg}")
    raise typer.Exit(2)


def _load(path: Path, slo_ttft: float | None, slo_itl: float | None):
    from servefleet.report.run import RunError, load_run
    from servefleet.stats import SLO

    try:
        run = load_run(path)
        if slo_ttft is not None or slo_itl is not None:
            run.slo = SLO(
                slo_ttft if slo_ttft is not None else run.slo.ttft,
                slo_itl if slo_itl is not None else run.slo.itl,
            )
        for p in run.points:  # read records now, so a broken file is a clear error here
            _ = p.records
        return run
    except (RunError, ValueError, OSError) as e:
        _fail(str(e))


SloTtft = Annotated[
    float | None,
    typer.Option(help="TTFT SLO in seconds (default: the run's).", callback=opts.POSITIVE),
]
SloItl = Annotated[
    float | None,
    typer.Option(help="TPOT SLO in seconds (default: the run's).", callback=opts.POSITIVE),
]


def report_app() -> typer.Typer:
    app = typer.Typer(
        help="Tables, Markdown, JSON and HTML reports of bench/simulate runs; compare two runs.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )

    @app.command()
    def show(
        run: Annotated[Path, typer.Argument(help="A run folder (--out of bench or simulate).")],
        format: Annotated[
            str, typer.Option("--format", "-f", help="table | markdown | json")
        ] = "table",
        slo_ttft: SloTtft = None,
        slo_itl: SloItl = None,
    ) -> None:
        """Print a run: the sweep table with the knee, self-checks and server metrics."""
        data = _load(run, slo_ttft, slo_itl)
        if format == "table":
            from servefleet.report.terminal import print_run

            print_run(data, console)
        elif format in ("markdown", "md"):
            from servefleet.report.markdown import render_markdown

            print(render_markdown(data), end="")
        elif format == "json":
            from servefleet.report.jsonout import render_json

            print(json.dumps(render_json(data), indent=2))
        else:
            _fail(f"--format {format!r}: use table, markdown or json")

    @app.command()
    def html(
        run: Annotated[
            Path,
            typer.Argument(help="A run folder (--out of bench, simulate or quality)."),
        ],
        out: Annotated[
            Path | None, typer.Option(help="HTML file (default: RUN/report.html).")
        ] = None,
        slo_ttft: SloTtft = None,
        slo_itl: SloItl = None,
    ) -> None:
        """Write a self-contained HTML report with plots (opens offline, no external files);
        with the output-quality comparison of `servefleet quality` when the folder holds one."""
        from servefleet.report.html import render_html, render_quality_page
        from servefleet.report.quality import QUALITY_FILE

        folder = run if run.is_dir() else run.parent
        target = out or folder / "report.html"
        quality = None
        if (folder / QUALITY_FILE).is_file():
            try:
                quality = json.loads((folder / QUALITY_FILE).read_text())
            except ValueError as e:
                _fail(f"{folder / QUALITY_FILE}: not valid JSON: {e}")
            if not (folder / "summary.json").is_file():
                target.write_text(render_quality_page(quality), encoding="utf-8")
                console.print(f"report written to {target}")
                return
        data = _load(run, slo_ttft, slo_itl)
        target.write_text(render_html(data, quality=quality), encoding="utf-8")
        console.print(f"report written to {target}")

    @app.command()
    def compare(
        a: Annotated[Path, typer.Argument(help="Run A (e.g. a simulate --out folder).")],
        b: Annotated[Path, typer.Argument(help="Run B (e.g. a bench --out folder).")],
        format: Annotated[
            str, typer.Option("--format", "-f", help="table | markdown | json")
        ] = "table",
        figures: Annotated[
            str | None, typer.Option(help="Comma-separated figures (default: the main ones).")
        ] = None,
        html: Annotated[
            Path | None, typer.Option(help="Also write an HTML comparison with plots.")
        ] = None,
    ) -> None:
        """Two runs side by side over all their points (same kind of load), with B ÷ A and a
        one-line verdict per figure; a run without a point at some load is interpolated
        there (inside its range)."""
        from servefleet.report.compare import (
            align,
            compare_html,
            compare_json,
            compare_markdown,
            figures_of,
            print_compare,
        )

        ra, rb = _load(a, None, None), _load(b, None, None)
        try:
            figs = figures_of(figures)
            rows = align(ra, rb, figs[:1])
        except ValueError as e:
            _fail(str(e))
        if not any(r.cells[figs[0].key].ratio is not None for r in rows):
            _fail(f"the loads of {a} and {b} do not overlap; nothing to line up")
        if format == "table":
            print_compare(ra, rb, console, figs)
        elif format in ("markdown", "md"):
            print(compare_markdown(ra, rb, figs), end="")
        elif format == "json":
            print(compare_json(ra, rb, figs))
        else:
            _fail(f"--format {format!r}: use table, markdown or json")
        if html is not None:
            html.write_text(compare_html(ra, rb, figs), encoding="utf-8")
            console.print(f"comparison written to {html}")

    return app


def register(app: typer.Typer) -> None:
    """Add the ``report`` sub-app (show, html, compare) to the servefleet CLI."""
    app.add_typer(report_app(), name="report")
