"""Find the line a failed build log is quoted by, and the excerpt an operator reads (pure).

Why: like ``gh run view --log-failed``, an operator wants the failing step, not 50k lines. The
failing line is the first line with a hard error signature (kaniko's "error building image", a
non-zero ``RUN``, a traceback or assertion, a shell ``exit status N``), else the last line that says
error/failed, else the last line. Lines keep Iris's ``[task source]`` prefix as stored.
"""

from __future__ import annotations

import re

# Hard signatures, in the order a build log shows them; the first hit is where the failure is.
_HARD = re.compile(
    r"error building image|returned a non-zero code|Traceback \(most recent call last\)|AssertionError|"
    r"assertion failed|exit status [1-9]\d*|exit code [1-9]\d*|^\s*(FATAL|ERROR)\b|: command not found|"
    r"parameter null or not set|Refusing to build|MANIFEST differ|SHA-256 mismatch",
    re.I)
_SOFT = re.compile(r"\b(error|failed|failure|fatal)\b", re.I)
MAX_LINE = 300


def _payload(line: str) -> str:
    """The log text without Iris's ``[task source] `` prefix."""
    return line.split("] ", 1)[1] if line.startswith("[") and "] " in line else line


def failing_line_index(lines: list[str]) -> int | None:
    """Index of the line a failure is quoted by, or None for an empty log."""
    for i, line in enumerate(lines):
        if _HARD.search(_payload(line)):
            return i
    for i in range(len(lines) - 1, -1, -1):
        if _SOFT.search(_payload(lines[i])):
            return i
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].strip():
            return i
    return None


def failing_line(text: str) -> str | None:
    """The failing line itself (without the Iris prefix), shortened for messages and history."""
    lines = text.splitlines()
    i = failing_line_index(lines)
    if i is None:
        return None
    quoted = _payload(lines[i]).strip()
    return quoted if len(quoted) <= MAX_LINE else quoted[:MAX_LINE - 1] + "…"


def excerpt(text: str, before: int = 30, after: int = 10) -> list[tuple[int, str, bool]]:
    """(1-based line number, line, is_failing) around the failing line; the whole tail if none."""
    lines = text.splitlines()
    i = failing_line_index(lines)
    if i is None:
        return []
    lo, hi = max(0, i - before), min(len(lines), i + after + 1)
    return [(n + 1, lines[n], n == i) for n in range(lo, hi)]
