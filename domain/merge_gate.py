"""The merge gate's decisions, pure and Temporal-free: which checks are required and how they stand,
which reviews block, and whether a GitHub comment or review authorizes the merge.

Why here: the rules (runbook: "merge only with user authorization and green *required* checks") are
the part worth testing exhaustively; the activity only fetches what GitHub says and feeds it in.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, Field

CheckState = Literal["success", "failure", "pending"]
# Review states that change a reviewer's standing on GitHub; COMMENTED (and PENDING drafts) do not.
_STANDING = {"APPROVED", "CHANGES_REQUESTED", "DISMISSED"}
WRITE_PERMISSIONS = {"admin", "write"}  # GitHub reports maintain as "write", triage as "read"
APPROVE_COMMAND = "/approve-merge"


class RequiredChecks(BaseModel):
    """The base branch's required checks and where that answer came from (shown in the report)."""

    names: list[str] = Field(default_factory=list)
    source: str  # e.g. "github:branch-protection", "github:rulesets", "config:github.required_checks"
    note: str = ""  # why a fallback was used (e.g. the token may not read branch protection)
    all_reported: bool = False  # nothing named: every reported check counts (fail closed)


class CheckVerdict(BaseModel):
    state: CheckState
    failing: list[str] = Field(default_factory=list)
    pending: list[str] = Field(default_factory=list)
    optional_failing: list[str] = Field(default_factory=list)
    overridden: list[str] = Field(default_factory=list)


def required_set(protection: list[str] | None, rulesets: list[str] | None, configured: list[str],
                 *, unreadable: str = "") -> RequiredChecks:
    """GitHub's answer when it has one (protection ∪ rulesets), else the configured list, else every check.

    ``protection``/``rulesets`` are None when GitHub could not tell (``unreadable`` says why); an empty
    list means GitHub says none are required there."""
    named = sorted(set(protection or []) | set(rulesets or []))
    sources = [s for s, v in (("github:branch-protection", protection), ("github:rulesets", rulesets)) if v]
    if named:
        return RequiredChecks(names=named, source="+".join(sources), note=unreadable)
    why = unreadable or "the base branch requires no checks on GitHub"
    if configured:
        return RequiredChecks(names=sorted(set(configured)), source="config:github.required_checks", note=why)
    return RequiredChecks(source="all reported checks", all_reported=True,
                          note=f"{why}; no github.required_checks configured, so every reported check is required")


def fold(states: Iterable[tuple[str, CheckState]]) -> dict[str, CheckState]:
    """One state per check name (check runs and commit statuses together); the worst report wins."""
    rank = {"success": 0, "pending": 1, "failure": 2}
    out: dict[str, CheckState] = {}
    for name, state in states:
        if name not in out or rank[state] > rank[out[name]]:
            out[name] = state
    return out


def verdict(reported: dict[str, CheckState], required: RequiredChecks, overrides: Iterable[str] = ()) -> CheckVerdict:
    """How the required checks stand. A required check not reported yet is pending (absence of CI is never
    success); an overridden one (an operator's decision, with a reason) no longer blocks."""
    over = set(overrides)
    names = sorted(reported) if required.all_reported else list(required.names)
    considered = [n for n in names if n not in over]
    failing = [n for n in considered if reported.get(n) == "failure"]
    pending = [n for n in considered if reported.get(n, "pending") == "pending"]
    optional = [] if required.all_reported else sorted(
        n for n, s in reported.items() if s == "failure" and n not in required.names)
    if failing:
        state: CheckState = "failure"
    elif pending or (required.all_reported and not reported):
        state = "pending"
    else:
        state = "success"
    return CheckVerdict(state=state, failing=failing, pending=pending, optional_failing=optional,
                        overridden=sorted(over & set(names)))


def standing(reviews: Iterable[tuple[str, str, str | None]]) -> dict[str, tuple[str, str, str | None]]:
    """Each reviewer's latest standing review, as GitHub counts it: (login, state, commit) by lower-cased
    login; a COMMENTED review after CHANGES_REQUESTED leaves the request in force."""
    out: dict[str, tuple[str, str, str | None]] = {}
    for login, state, commit in reviews:
        if state in _STANDING and login:
            out[login.lower()] = (login, state, commit)
    return out


def is_approve_command(body: str) -> bool:
    """A comment whose first line is ``/approve-merge`` (optionally followed by a note)."""
    first = next((line.strip() for line in (body or "").splitlines() if line.strip()), "")
    head, _, _ = first.partition(" ")
    return head.lower() == APPROVE_COMMAND
