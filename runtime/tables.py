"""Operator tables for ``status`` and ``schedule list``: headers, times, one row per item.

On a terminal the table is drawn by ``rich`` (it owns widths and wrapping, as in ``follow``); in a pipe
or a log it is plain aligned columns, so ``grep``/``awk`` keep working and nothing is cut. ``--json``
never comes here. Times are UTC, to the second, and durations short (``3m05s``, ``2h10m``, ``4d03h``).
"""

from __future__ import annotations

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


def render(headers: Sequence[str], rows: Sequence[Sequence[str]], *, stream: TextIO | None = None,
           title: str | None = None) -> None:
    stream = stream or sys.stdout
    if not stream.isatty():
        if title:
            stream.write(printable(title) + "\n")
        stream.write(plain(headers, rows) + "\n")
        return
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text  # literal cells: a "[done]" in a value is text, not rich markup

    table = Table(*headers, title=title, box=box.SIMPLE_HEAD, header_style="bold", title_justify="left")
    for r in rows:
        table.add_row(*(Text(printable(c)) for c in r))
    Console(file=stream, highlight=False).print(table)
