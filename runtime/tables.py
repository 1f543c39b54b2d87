"""Operator tables for ``status`` and ``schedule list``: headers, times, one row per item.

On a terminal the table is drawn by ``rich`` (it owns widths and wrapping, as in ``follow``) and the id
column is never cut or wrapped (``fit_columns``); in a pipe or a log it is plain aligned columns, so
``grep``/``awk`` keep working and nothing is cut. ``--json``
never comes here. Times are UTC, to the second, and durations short (``3m05s``, ``2h10m``, ``4d03h``).
"""

from __future__ import annotations

import io
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TextIO

from domain.terminal_text import printable


def when(t: datetime | None) -> str:
    """A UTC time to the second, e.g. ``2026-12-02 03:00:05``; ``-`` when unknown."""
    if t is None:
        return "-"
    return t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def duration(seconds: float | None) -> str:
    if seconds is None or seconds < 0:
        return "-"
    s = int(seconds)
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def plain(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Aligned columns (two spaces apart), upper-case headers; the last column is not padded."""
    cells = [[h.upper() for h in headers], *[[printable(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)


def rich_table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, whole: Sequence[int] = (0,),
               **options):
    """A rich table of literal cells (a ``"[done]"`` is text, not markup); the ``whole`` columns never
    wrap, so an id stays on one line."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(box=options.pop("box", box.SIMPLE_HEAD), header_style="bold", **options)
    for i, h in enumerate(headers):
        table.add_column(h, no_wrap=i in whole, overflow="fold",
                         min_width=max((len(printable(str(r[i]))) for r in rows), default=0) if i in whole else None)
    for r in rows:  # a cell's own line breaks are kept (stacked values) except in an id; no other control character
        table.add_row(*(Text(printable(c) if i in whole else "\n".join(printable(x) for x in str(c).split("\n")))
                        for i, c in enumerate(r)))
    return table


def _text(renderable, width: int) -> str:
    from rich.console import Console

    out = io.StringIO()
    Console(file=out, width=width, color_system=None, force_terminal=False, highlight=False).print(renderable)
    return out.getvalue()


def fits(text: str, width: int, whole: Sequence[str]) -> bool:
    """No line wider than ``width`` and every ``whole`` value printed uncut on one line (a value has no
    line break, so finding it in the text finds it within one line)."""
    return all(len(line) <= width for line in text.splitlines()) and all(w in text for w in whole)


def _widest(rows: Sequence[Sequence[str]]) -> list[Sequence[str]]:
    """The rows that decide rich's column widths: per column, the one with the longest line and the one
    with the longest word. Measuring these instead of every row gives the same widths, in constant time."""
    if not rows:
        return []

    def longest(cell: str, split) -> int:
        return max((len(printable(p)) for p in split(str(cell))), default=0)

    picked = set()
    for i in range(len(rows[0])):
        picked.add(max(range(len(rows)), key=lambda n: longest(rows[n][i], lambda c: c.split("\n"))))
        picked.add(max(range(len(rows)), key=lambda n: longest(rows[n][i], str.split)))
    return [rows[n] for n in sorted(picked)]


def fit_columns(headers: Sequence[str], rows: Sequence[Sequence[str]], width: int, *,
                whole: Sequence[int] = (0,), drop: Sequence[str] = (), foldable: Sequence[str] = (),
                **options) -> list[int] | None:
    """The columns to show at ``width``: every one when rich can wrap the others (between words) around the
    uncut ``whole`` columns (``foldable`` ones anywhere), else without the first of ``drop`` (least useful
    first), and so on; None
    when only the ``whole`` columns would be left. Measured by rendering, not estimated, so rich's own
    padding and wrapping decide."""
    shown = list(range(len(headers)))
    dropping = [headers.index(h) for h in drop if h in headers]
    rows = _widest(rows)
    while True:
        # Uncut: the whole columns' values, and every word of the others (they wrap between words only).
        values = [printable(str(r[i])) for r in rows for i in whole]
        # ``foldable`` columns (free text) may also break inside a word.
        values += [w for i in shown if i not in whole and headers[i] not in foldable
                   for c in [headers[i], *(r[i] for r in rows)] for w in printable(str(c)).split()]
        table = rich_table([headers[i] for i in shown], [[r[i] for i in shown] for r in rows],
                           whole=[shown.index(i) for i in whole if i in shown], **options)
        if fits(_text(table, width), width, values):
            return list(shown)
        if not dropping or len(shown) - 1 <= len(whole):  # the ids alone: records() says more
            return None
        shown.remove(dropping.pop(0))


def records(headers: Sequence[str], rows: Sequence[Sequence[str]], *, key: int = 0) -> str:
    """One block per row: its id alone on a line (longer than the terminal: never cut), then the other
    cells as ``header: value`` lines."""
    out = []
    for r in rows:
        out.append(printable(r[key]))
        out += [f"  {h}: {printable(c)}" for i, (h, c) in enumerate(zip(headers, r, strict=True)) if i != key]
    return "\n".join(out)


def render(headers: Sequence[str], rows: Sequence[Sequence[str]], *, stream: TextIO | None = None,
           title: str | None = None, drop: Sequence[str] = (), width: int | None = None) -> None:
    """Print the table. On a terminal the first column (the id every other command takes) is never cut
    or wrapped: the other columns wrap first, then the ``drop`` columns go (named in a note), and when
    the id alone is wider than the terminal each row becomes a block with the id on its own line."""
    stream = stream or sys.stdout
    if not stream.isatty():
        if title:
            stream.write(printable(title) + "\n")
        stream.write(plain(headers, rows) + "\n")
        return
    from rich.console import Console

    console = Console(file=stream, highlight=False, width=width)
    width = console.width
    if title:
        console.print(printable(title), markup=False)
    shown = fit_columns(headers, rows, width, drop=drop)
    if shown is None:
        console.print(records(headers, rows), markup=False, soft_wrap=True)
        return
    console.print(rich_table([headers[i] for i in shown], [[r[i] for i in shown] for r in rows]))
    hidden = [h for i, h in enumerate(headers) if i not in shown]
    if hidden:
        console.print(f"(at {width} columns without: {', '.join(hidden)}; --json shows every field)",
                      markup=False)
