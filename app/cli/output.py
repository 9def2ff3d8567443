"""Tables on the terminal, drawn with rich (installed with typer).

``print_table`` prints a header row and one row per item, columns sized to their
content, no borders, so ``awk``/``split()`` still read it. In a terminal the last
column wraps at the terminal's width (an error message is shown whole, never cut);
piped into a file or another program nothing wraps: each row stays one line.
rich is imported on the first table, not when the command line starts.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence

PIPE_WIDTH = 100_000  # "unbounded" when stdout is not a terminal


def print_table(columns: Sequence[str], rows: Iterable[Sequence[str]], *,
                right: Sequence[str] = ()) -> None:
    """Print ``rows`` under ``columns``; those named in ``right`` are right-aligned."""
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    tty = sys.stdout.isatty()
    table = Table(box=box.SIMPLE_HEAD if tty else None, show_edge=False, pad_edge=False,
                  header_style="bold" if tty else "", show_header=True)
    last = len(columns) - 1
    for i, name in enumerate(columns):
        table.add_column(name, justify="right" if name in right else "left",
                         no_wrap=i != last, overflow="fold")
    for row in rows:
        table.add_row(*(Text(str(cell)) for cell in row))  # never markup
    console = Console(file=sys.stdout, width=None if tty else PIPE_WIDTH,
                      highlight=False, markup=False, emoji=False, soft_wrap=not tty)
    if tty:
        console.print(table)
        return
    with console.capture() as captured:
        console.print(table)
    for line in captured.get().splitlines():
        sys.stdout.write(line.rstrip() + "\n")
