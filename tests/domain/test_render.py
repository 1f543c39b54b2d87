"""Operator text in GitHub Markdown renders literally: checked by rendering it with a CommonMark parser
(HTML and linkify on, as GitHub has them) and with GitHub's trigger patterns."""

from __future__ import annotations

import re

import pytest
from markdown_it import MarkdownIt

from domain.issue_ref import IssueRef, parse_issue_ref
from domain.render import MAX_INLINE, inert_markdown, strip_control

MD = MarkdownIt("commonmark", {"html": True, "linkify": False}).enable("table")


@pytest.mark.parametrize("text", [
    "<script>alert(1)</script>", "<img src=x onerror=alert(1)>", "![pixel](https://e.vil/p.png)",
    "[click](https://e.vil)", "<https://e.vil>", "**bold** _it_ `code`", "a | b | c",
])
def test_markup_renders_as_text(text):
    html = MD.render(inert_markdown(text))
    assert not re.search(r"<(?!/?p>)", html), html  # only the paragraph wrapper is markup


@pytest.mark.parametrize("text", ["Closes #1", "fixed owner/repo#12", "Resolves https://github.com/o/r/issues/3",
                                  "cc @team and @org/infra", "see GH-42"])
def test_github_triggers_are_broken(text):
    out = inert_markdown(text)
    assert not re.search(r"(?<![\w\u200b])@[A-Za-z0-9]", out)
    assert not re.search(r"#\d|GH-\d", out, re.IGNORECASE)
    assert not re.search(r"(?i)\b(close[sd]?|fix(e[sd])?|resolve[sd]?)\b", out)
    assert out.replace("\u200b", "") == text  # invisible: the operator's words read exactly as typed


def test_control_characters_and_length():
    assert strip_control("a\x1b[2Jb\x1b]0;t\x07c\x00d\ne") == "abcd e"
    long = inert_markdown("x" * 5000)
    assert len(long) == MAX_INLINE and long.endswith("…")


def test_issue_refs():
    assert parse_issue_ref("https://github.com/marin-community/marin/issues/7920") == \
        IssueRef(repo="marin-community/marin", number=7920)
    assert parse_issue_ref("https://github.com/o/r/pull/3#issuecomment-1") == IssueRef(repo="o/r", number=3)
    assert parse_issue_ref(" o/r#4 ") == IssueRef(repo="o/r", number=4)
    assert parse_issue_ref("#5").in_repo("a/b") == ("a/b", 5)
    with pytest.raises(ValueError, match="--issue-url"):
        parse_issue_ref("https://github.com/o/r")
