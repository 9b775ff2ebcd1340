"""Tables drawn in a narrow terminal: split into parts, text wrapped between words, never a
figure cut or replaced by an ellipsis (report.fit)."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from servefleet.report.fit import Fitted


def _draw(table: Table, width: int) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(Fitted(table))
    return console.export_text()


def _wide_table() -> Table:
    t = Table(title="sweep", caption="the caption")
    t.add_column("configuration")
    t.add_column("what it rests on")
    for name in ("p50/p95/p99 TTFT", "ok/sent", "output tok/s", "E2E p50", "goodput", "KV"):
        t.add_column(name, justify="right")
    t.add_row(
        "4 x TP=2", "an assumption about the link that nobody measured on this GPU yet",
        "576/1,262/1,768", "3064/3064", "1,538.25", "16.05 s", "4.61", "100.0%",
    )  # fmt: skip
    return t


def test_a_wide_table_is_split_and_keeps_every_figure_whole():
    for width in (80, 50):
        text = _draw(_wide_table(), width)
        assert "…" not in text
        assert max(len(line) for line in text.splitlines()) <= width
        for figure in ("576/1,262/1,768", "3064/3064", "1,538.25", "16.05 s", "100.0%"):
            assert figure in text, (width, figure)
        assert text.count("4 x TP=2") >= 2 and "sweep (continued)" in text  # the key repeats
        assert text.count("the caption") == 1


def test_a_table_that_fits_is_drawn_as_it_is():
    wide = _draw(_wide_table(), 250)
    assert "(continued)" not in wide and "an assumption about the link that nobody" in wide
