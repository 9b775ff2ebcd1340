"""Tables that fit the terminal they are drawn in, without cutting a figure.

Rule: a column of short cells (figures: every cell at most ``FIGURE_WIDTH`` characters) is
never wrapped, and a column of text wraps between words but never inside one. When the table
is wider than the console, text columns are narrowed first, down to their longest word; when
even that does not fit, the table is drawn in parts, each repeating the first column (the row's
name), the title marked as continued and the caption under the last part. Nothing is ever
replaced by an ellipsis. The widths are decided when the table is drawn, so one renderable
fits an 80-column terminal and a wide one alike (the JSON and Markdown outputs keep every
column whatever the width).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.measure import Measurement
from rich.rule import Rule
from rich.table import Column, Table
from rich.text import Text

FIGURE_WIDTH = 16
"""A cell up to this wide is a figure ("870/4,891/6,985"): never wrapped."""


def _plain(cell: RenderableType, markup: bool = True) -> str | None:
    if isinstance(cell, Text):
        return cell.plain
    if isinstance(cell, str):
        return Text.from_markup(cell).plain if markup else cell
    return None


def _lines(text: str) -> list[str]:
    return text.splitlines() or [""]


def _widths(console: Console, options: ConsoleOptions, col: Column) -> tuple[int, int]:
    """(least, natural) content width of a column: its widest line, and the width below
    which a figure or a word would have to be cut."""
    cells = [_plain(c) for c in col.cells]
    head = _plain(col.header) if col.header is not None else ""
    natural, least = 0, 0
    figure = col.no_wrap or all(
        c is not None and max(cell_len(x) for x in _lines(c)) <= FIGURE_WIDTH for c in cells
    )
    for c, raw in zip(cells, col.cells, strict=True):
        if c is None:  # another renderable: rich's own measure
            m = Measurement.get(console, options, raw)
            natural, least = max(natural, m.maximum), max(least, m.minimum)
            continue
        for line in _lines(c):
            natural = max(natural, cell_len(line))
            words = [line] if figure else line.split()
            least = max(least, *(cell_len(w) for w in words), 0)
    for line in _lines(head or ""):
        natural = max(natural, cell_len(line))
        least = max(least, *(cell_len(w) for w in line.split()), 0)
    return max(least, 1), max(natural, least, 1)


def _padding(table: Table, n: int) -> int:
    """Padding around ``n`` columns' content, as rich adds it."""
    _, right, _, left = table.padding
    if table.collapse_padding:
        left = 0
    total = n * (left + right)
    if not table.pad_edge:
        total -= left + right
    return max(total, 0)


def _border(table: Table, n: int) -> int:
    if not table.box:
        return 0
    return (2 if table.show_edge else 0) + n - 1


def _part(table: Table, cols: list[int], widths: dict[int, int] | None, first: bool, last: bool):
    out = copy.copy(table)
    out.columns = []
    for new_index, i in enumerate(cols):
        c = copy.copy(table.columns[i])
        c._index = new_index
        if widths is not None:
            c.width = widths[i]
            c.overflow = "fold"  # never an ellipsis, whatever happens
        out.columns.append(c)
    if not first and table.title:
        out.title = f"{_plain(table.title) or ''} (continued)"
    if not last:
        out.caption = None
    return out


def split_to_width(
    table: Table, width: int, console: Console, options: ConsoleOptions
) -> list[Table]:
    """``table`` as one or more tables no wider than ``width`` (the rule above)."""
    cols = table.columns
    if not cols:
        return [table]
    measured = [_widths(console, options, c) for c in cols]
    least = [m[0] for m in measured]
    natural = [m[1] for m in measured]
    n = len(cols)
    if sum(natural) + _padding(table, n) + _border(table, n) <= width:
        return [table]

    def fits(cols: list[int]) -> bool:
        k = len(cols)
        return sum(least[j] for j in cols) + _padding(table, k) + _border(table, k) <= width

    # the fewest parts: each with the first column and as many as fit at their least widths
    parts_needed = len(_pack(range(1, n), lambda g: fits([0, *g])))
    # then as even as those parts allow: a part closes once its columns' natural widths reach
    # an equal share of all of them
    share = sum(natural[1:]) / parts_needed
    groups = [
        [0, *g]
        for g in _pack(
            range(1, n), lambda g: fits([0, *g]) and sum(natural[j] for j in g[:-1]) < share
        )
    ]
    parts = []
    for k, g in enumerate(groups):
        room = width - _padding(table, len(g)) - _border(table, len(g))
        w = {i: natural[i] for i in g}
        excess = sum(w.values()) - room
        while excess > 0:  # narrow the widest text column that can be, a character at a time
            can = [j for j in g if w[j] > least[j]]
            if not can:
                break
            i = max(can, key=lambda j: (w[j], -j))
            w[i] -= 1
            excess -= 1
        parts.append(_part(table, g, w, k == 0, k == len(groups) - 1))
    return parts


def _pack(items: Iterable[int], ok) -> list[list[int]]:
    """``items`` in order, in consecutive groups: an item joins the current group while
    ``ok(group + [item])``, else starts the next (a group is never empty)."""
    groups: list[list[int]] = []
    for i in items:
        if groups and ok([*groups[-1], i]):
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups or [[]]


class Fitted:
    """A rich table drawn to fit the console's width (``split_to_width``)."""

    def __init__(self, table: Table) -> None:
        self.table = table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield from split_to_width(self.table, options.max_width, console, options)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.table)


def fitted(items: Iterable[RenderableType]) -> list[RenderableType]:
    """``items`` with every table wrapped in ``Fitted``."""
    return [Fitted(x) if isinstance(x, Table) else x for x in items]


class Heading:
    """A section heading: a rule with the title in it where the title fits the width, else
    the title alone (a rule would cut it)."""

    def __init__(self, title: Text) -> None:
        self.title = title

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if cell_len(self.title.plain) + 4 <= options.max_width:
            yield Rule(self.title, align="left", style="dim")
        else:
            yield self.title
