"""Operator text made inert before it enters GitHub Markdown (PR bodies, issue comments).

Why: `--requested-by`, `--reason` and `--link` are free text typed by whoever starts a build, and the
PR body is rendered by GitHub, which acts on some text: HTML tags, `@mentions` (notifications),
`#123` / `owner/repo#123` references and closing keywords (`Closes #1` closes an issue on merge),
Markdown links and images (a tracking pixel). Escaping each construct by hand is what GitHub's own
reference filters force: they run on the rendered text, so a backslash escape does not stop them,
while a zero-width space (U+200B) between the trigger and its target does, and stays invisible.
"""

from __future__ import annotations

import html
import re

ZWSP = "\u200b"
MAX_INLINE = 500  # characters of operator text in one place of a PR body

_CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()!|~])")
_MENTION = re.compile(r"@(?=[A-Za-z0-9])")
_REFERENCE = re.compile(r"#(?=\d)|(?<=\bGH)-(?=\d)", re.IGNORECASE)
_CLOSING = re.compile(r"\b(clos(?:e|es|ed)|fix(?:es|ed)?|resolv(?:e|es|ed))\b", re.IGNORECASE)
_URL_SCHEME = re.compile(r"\b(https?)://", re.IGNORECASE)


def strip_control(text: str) -> str:
    """Remove terminal escape sequences and control characters (tabs and newlines become spaces)."""
    text = _CONTROL.sub("", text.replace("\t", " ").replace("\r", " ").replace("\n", " "))
    return text


def inert_markdown(text: str, *, limit: int = MAX_INLINE) -> str:
    """``text`` as one line of Markdown that renders literally and triggers nothing on GitHub."""
    text = " ".join(strip_control(text).split())
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    text = html.escape(text, quote=False)  # no tags, no entities of the operator's own
    text = _MD_SPECIAL.sub(r"\\\1", text)  # no links, images, emphasis, code or table breaks
    text = _MENTION.sub("@" + ZWSP, text)
    text = _REFERENCE.sub(lambda m: m.group(0) + ZWSP, text)
    text = _CLOSING.sub(lambda m: m.group(0)[0] + ZWSP + m.group(0)[1:], text)
    return _URL_SCHEME.sub(lambda m: m.group(1) + ":" + ZWSP + "//", text)  # no autolinks either
