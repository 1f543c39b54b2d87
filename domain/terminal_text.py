"""Text that reaches an operator's terminal: no escape sequences or control characters.

Why: reports and progress print operator-supplied strings (reasons, names) and log-derived ones
(markers, failure reasons); an ``ESC[2J`` or an OSC title sequence in a build log must not repaint or
retitle the operator's terminal. Newlines and tabs survive only where a caller allows them.
"""

from __future__ import annotations

import re

from domain.redact import redact

# CSI (ESC [ ... final), OSC (ESC ] ... BEL or ESC \), other two-byte ESC sequences, and C1 CSI/OSC.
_ESCAPES = re.compile(r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]|(?:\x1b\]|\x9d).*?(?:\x07|\x1b\\|\x9c)|\x1b[@-_]?")
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str | None, *, multiline: bool = False) -> str:
    """``text`` without escape sequences and control characters (``\\n``/``\\t`` kept if ``multiline``)."""
    if not text:
        return ""
    # Escape sequences first, then the redactor: stripped after it, a token split by colour codes would be
    # joined back together on the operator's terminal (starter stdout and stderr are a sink like any).
    out = redact(_CONTROLS.sub("", _ESCAPES.sub("", text)))
    return out if multiline else out.replace("\n", " ").replace("\t", " ")


# DEL and C1 controls (``\x9b`` is a CSI to a terminal): json.dumps and pydantic escape only C0 controls.
_JSON_RAW_CONTROLS = re.compile(r"[\x7f-\x9f]")


def printable_json(text: str) -> str:
    """A JSON document (``--json``, ``--format json``) for the terminal, still valid JSON: the raw DEL and C1
    controls a serializer leaves are escaped (``\\u009b``; they occur only inside strings), then the same
    redactor as every other line. It decodes JSON escapes before it matches, so a colour-split token inside a
    string (``\\u001b[31m``) is found, and it replaces whole escapes only, so the document still parses."""
    return redact(_JSON_RAW_CONTROLS.sub(lambda m: f"\\u{ord(m.group()):04x}", text))


def shorten(text: str | None, width: int) -> str:
    """One printable line of at most ``width`` characters (an ellipsis marks a cut)."""
    line = printable(text)
    return line if len(line) <= width else line[: max(width - 1, 0)] + "…"


def plain_line(text: str | None) -> str:
    """Upstream or operator text as one terminal line: printable, whitespace collapsed, literal (never the
    HTML entities or Markdown escapes it gets where GitHub renders it, e.g. ``->`` not ``-&gt;``)."""
    return " ".join(printable(text).split())
