"""Read AGENTS.md: the repository policy a build service must honour, wherever the file states it.

Why markdown-it-py: AGENTS.md is free prose whose headings change ("Policy", "Fork policy", "Agent
skill policy", none at all). A CommonMark parser gives paragraphs and list items with their line
numbers, so policy is read from every section whose heading says "policy" and "do not edit `path`"
rules from any sentence. A file without policy never refuses a build: the policy is then empty and
the configured ``github.do_not_touch`` list still protects its paths.
"""

from __future__ import annotations

import re

from markdown_it import MarkdownIt

from domain.contract.models import AgentsPolicy, PolicyLine

AGENTS_PATH = "AGENTS.md"

_DO_NOT_TOUCH = re.compile(r"\b(do not|don't|never|must not)\s+(add to|add|edit|touch|modify|change)\b", re.I)


def parse_agents(text: str | None, path: str = AGENTS_PATH) -> AgentsPolicy:
    """Policy lines (under headings that say "policy") and the paths the file forbids editing."""
    if text is None:
        return AgentsPolicy(path=path, policy=[])
    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    heading = ""
    policy: list[PolicyLine] = []
    sentences: list[PolicyLine] = []
    for i, t in enumerate(tokens):
        if t.type == "heading_open":
            heading = tokens[i + 1].content
            continue
        if t.type != "inline" or not t.map or tokens[i - 1].type != "paragraph_open":
            continue
        line = PolicyLine(text=" ".join(t.content.split()), line=t.map[0] + 1)
        sentences.append(line)
        if "policy" in heading.lower():
            policy.append(line)
    do_not_touch: list[str] = []
    for p in sentences:
        for sentence in re.split(r"(?<=[.;])\s+", p.text):
            if _DO_NOT_TOUCH.search(sentence):
                first = re.search(r"`([^`\s]+\.[A-Za-z0-9]+)`", sentence)
                if first and first.group(1) not in do_not_touch:
                    do_not_touch.append(first.group(1))
    return AgentsPolicy(path=path, policy=policy, do_not_touch=do_not_touch)
