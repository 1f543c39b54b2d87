"""docs/troubleshooting.md's refusals of a first deploy or build say what the code says: each entry's
text is a fragment of one string literal (f-string parts included) in the module it names, so a
reworded message fails here until its entry follows. The check itself fails on a fragment the code
does not hold, and on a module that does not exist."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from domain import troubleshooting as ts

ROOT = Path(__file__).resolve().parents[2]
ENTRIES = [r for _, rs in ts.REFUSALS for r in rs]


def literals(rel: str) -> list[str]:
    """Every string literal in ``rel``; an f-string contributes each of its literal parts."""
    tree = ast.parse((ROOT / rel).read_text(), rel)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.append(node.value)
    return out


def found(says: str, rel: str) -> bool:
    return any(says in s for s in literals(rel))


@pytest.mark.parametrize("entry", [r for r in ENTRIES if r.source], ids=lambda r: r.title)
def test_each_refusal_text_is_in_the_code_that_raises_it(entry):
    assert (ROOT / entry.source).is_file(), f"{entry.title}: {entry.source} does not exist"
    assert found(entry.says, entry.source), f"{entry.title}: {entry.says!r} is not a literal in {entry.source}"


def test_only_other_programs_texts_go_unchecked_and_they_say_so():
    unchecked = [r for r in ENTRIES if not r.source]
    assert [r.title for r in unchecked] == ["the Deployment stays at 0/1"]
    assert "Kubernetes' own event" in unchecked[0].meaning


def test_the_page_has_every_entry_and_the_four_kinds_the_issue_names():
    text = (ROOT / "docs" / "troubleshooting.md").read_text()
    for r in ENTRIES:
        assert f"#### {r.title}" in text and r.says in text
    titles = {t for t, _ in ts.REFUSALS}
    assert {"The rehearsal cannot isolate", "Preflight", "Iris", "No worker"} <= titles
    preflight = {r.title for r in dict(ts.REFUSALS)["Preflight"]}
    assert {"no push access (git)", "a classic token without the repo scope",
            "branch protection unreadable (403)"} <= preflight


def test_the_check_fails_on_text_the_code_does_not_hold():
    assert found("refuses this client as too old", "clients/iris.py")
    assert not found("refuses this client as much too old", "clients/iris.py")
    assert not found("no worker polls task queue", "clients/iris.py")  # right text, wrong module
    with pytest.raises(FileNotFoundError):
        literals("clients/no_such_module.py")
