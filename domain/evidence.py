"""Find the line a failed build log is quoted by, and the excerpt an operator reads (pure).

Why: like ``gh run view --log-failed``, an operator wants the failing step, not 50k lines. The
failing line is the first line with a hard error signature (kaniko's "error building image", a
non-zero ``RUN``, a traceback or assertion, a shell ``exit status N``), else the last line that says
error/failed, else the last line. Lines keep Iris's ``[task source]`` prefix as stored.

kaniko's own ``error building image: … exit status N`` only wraps the failed ``RUN``: when it is the
first hard line, the cause is the line the command printed last before it — in the wrapper's stream
(``[task stderr]``) if that has one, else in log order (Iris interleaves stdout and stderr only by
read batch) — after kaniko's last ``INFO[…] RUN`` line, skipping kaniko's ``INFO[0012]``-style
progress lines and the build script's ``set -x`` trace.
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
_WRAPPER = re.compile(r"^\s*error building image:.*exit status [1-9]\d*\s*$", re.I)
_KANIKO_PROGRESS = re.compile(r"^\s*(INFO|WARN|DEBU|TRAC)\[\d+\]")
_KANIKO_RUN = re.compile(r"^\s*INFO\[\d+\] RUN ")
_XTRACE = re.compile(r"^\++ ")  # bash ``set -x`` lines of the build script, not the command's output
MAX_LINE = 300


def _payload(line: str) -> str:
    """The log text without Iris's ``[task source] `` prefix."""
    return line.split("] ", 1)[1] if line.startswith("[") and "] " in line else line


def _stream(line: str) -> str:
    """The ``[task source]`` prefix of a stored line ("" when it has none)."""
    return line.split("] ", 1)[0] if line.startswith("[") and "] " in line else ""


def _cause_above(lines: list[str], wrapper: int) -> int | None:
    """The line the failed command printed last before kaniko's wrapper line (see the module doc):
    searched after kaniko's last ``RUN`` progress line, in the wrapper's stream first, then in the
    others — after the wrapper too, where another stream's last read batch can land."""
    start = next((j + 1 for j in range(wrapper - 1, -1, -1) if _KANIKO_RUN.match(_payload(lines[j]))), 0)
    stream = _stream(lines[wrapper])

    def output(j: int) -> bool:
        text = _payload(lines[j])
        return bool(text.strip()) and not _KANIKO_PROGRESS.match(text) and not _XTRACE.match(text)

    before = [j for j in range(wrapper - 1, start - 1, -1) if output(j)]
    same = [j for j in before if _stream(lines[j]) == stream] if stream else []
    if same or before:
        return (same or before)[0]
    return next((j for j in range(wrapper + 1, len(lines)) if output(j) and _stream(lines[j]) != stream
                 and not _WRAPPER.match(_payload(lines[j]))), None) if stream else None


def failing_line_index(lines: list[str]) -> int | None:
    """Index of the line a failure is quoted by, or None for an empty log."""
    for i, line in enumerate(lines):
        if _HARD.search(_payload(line)):
            if _WRAPPER.match(_payload(line)):
                cause = _cause_above(lines, i)
                return i if cause is None else cause
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
