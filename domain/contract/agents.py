"""Parse AGENTS.md: the repository policy lines a build service must honour."""

from __future__ import annotations

import re

from domain.contract.errors import ContractError
from domain.contract.models import AgentsPolicy, PolicyLine

AGENTS_PATH = "AGENTS.md"


def parse_agents(text: str, path: str = AGENTS_PATH) -> AgentsPolicy:
    lines = text.splitlines()
    start = next((i for i, t in enumerate(lines) if re.match(r"^##\s+Policy\s*$", t, re.I)), None)
    if start is None:
        raise ContractError(path, 0, "a '## Policy' section of '- ' bullets")
    policy: list[PolicyLine] = []
    for i in range(start + 1, len(lines)):
        t = lines[i]
        if re.match(r"^#{1,2}\s", t):
            break
        if t.startswith("- "):
            policy.append(PolicyLine(text=t[2:].strip(), line=i + 1))
        elif t.startswith("  ") and policy and t.strip():
            policy[-1].text += " " + t.strip()
    if not policy:
        raise ContractError(path, start + 1, "'- ' policy bullets under '## Policy'")
    do_not_touch = []
    for p in policy:
        if re.match(r"^(do not|never)\s+(add|edit|touch|modify|change)\b", p.text, re.I):
            first = re.search(r"`([^`\s]+\.[A-Za-z0-9]+)`", p.text)
            if first:
                do_not_touch.append(first.group(1))
    return AgentsPolicy(path=path, policy=policy, do_not_touch=do_not_touch)
