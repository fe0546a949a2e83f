"""Tables that read at any terminal width, 80 columns included: the column that names a row is
never cut, the others wrap at word boundaries, and where even that cannot fit, the columns of the
lowest priority are left out (and the table's caption says which)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

PIPE_WIDTH = 200
"""Width of a table printed into a pipe or a log without $COLUMNS: lines kept whole for grep."""


def terminal_width(pipe: int = PIPE_WIDTH) -> int | None:
    """The width tables are laid out for: on a terminal None (rich measures it, or reads $COLUMNS),
    else ``pipe`` (a pipe's reader has no width; $COLUMNS there is often a parent's, e.g. a test
    runner's)."""
    return None if sys.stdout.isatty() else pipe


@dataclass(frozen=True)
class Column:
    header: str
    priority: int = 1
    """Lower first: 0 is never left out (the row's name); higher ones go first when space is short."""
    wrap: bool = True
    """Whether the cells may wrap at spaces (a name or a number may not)."""
    justify: str = "left"


def _least(column: Column, cells: Sequence[str]) -> int:
    """The narrowest the column can be: its longest word (or whole cell when it may not wrap)."""
    pieces = [column.header, *cells]
    if column.wrap:
        return max((len(word) for text in pieces for word in text.split()), default=1)
    return max((len(text) for text in pieces), default=1)


def fitted_table(title: str, columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int) -> Table:
    """A rich table of ``rows`` that fits ``width`` columns, leaving out columns by priority."""
    least = [_least(c, [r[i] for r in rows]) for i, c in enumerate(columns)]
    kept = set(range(len(columns)))
    for i in sorted(range(len(columns)), key=lambda i: (-columns[i].priority, -i)):
        if sum(least[k] + 3 for k in kept) + 1 <= width or columns[i].priority == 0:
            break
        kept.discard(i)
    dropped = [columns[i].header for i in range(len(columns)) if i not in kept]
    caption = f"left out at this width: {', '.join(dropped)}" if dropped else None
    table = Table(title=title, caption=caption)
    for i in sorted(kept):
        c = columns[i]
        table.add_column(c.header, no_wrap=not c.wrap, overflow="fold" if c.wrap else "ellipsis",
                         justify=c.justify, min_width=least[i])  # type: ignore[arg-type]
    for row in rows:
        table.add_row(*(row[i] for i in sorted(kept)))
    return table


def print_table(title: str, columns: Sequence[Column], rows: Sequence[Sequence[str]],
                console: Console | None = None) -> None:
    """:func:`fitted_table` printed on stdout (or ``console``) at its width."""
    console = console or Console(width=terminal_width(), highlight=False)
    console.print(fitted_table(title, columns, rows, console.width), markup=False)
