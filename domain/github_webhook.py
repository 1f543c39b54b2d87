"""GitHub webhook deliveries: the signature check and what an event says about which PR changed.

Why pure: the receiver (runtime/webhooks.py) only decides *whom to wake*; the gate state itself is
always read again from GitHub by the PR watch, so nothing here is trusted beyond "this branch / PR
may have changed". GitHub signs each body with the webhook's secret (``X-Hub-Signature-256:
sha256=<hex HMAC-SHA256>``); the comparison is constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from pydantic import BaseModel, Field

from domain.merge_gate import is_approve_command

# The events that can change what the merge gate reads (checks, statuses, reviews, the PR and its head), or
# end the wait from outside: ``pull_request`` closed (by hand, or merged) and ``delete`` of the build branch.
# ``push`` (and ``pull_request`` ``synchronize``): the build branch moved; the merge wait compares its head with
# the pin commit before any merge.
WAKING_EVENTS = ("check_run", "check_suite", "status", "pull_request", "pull_request_review", "issue_comment",
                 "delete", "push")
SIGNATURE_HEADER = "X-Hub-Signature-256"


def sign(secret: bytes, body: bytes) -> str:
    """The ``X-Hub-Signature-256`` value GitHub sends for ``body``."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def signature_problem(secret: bytes, body: bytes, header: str | None) -> str | None:
    """Why a delivery's signature is refused (None: it is GitHub's, made with our secret). The reason
    names the header, never the secret or the expected value."""
    if not header:
        return f"unsigned: no {SIGNATURE_HEADER} header"
    algo, _, digest = header.strip().partition("=")
    if algo != "sha256" or not digest:
        return f"{SIGNATURE_HEADER} is not 'sha256=<hex>'"
    if not hmac.compare_digest(sign(secret, body).encode(), f"sha256={digest.lower()}".encode()):
        return f"{SIGNATURE_HEADER} does not match the body (wrong secret, or the body was altered)"
    return None


class PullRequestEvent(BaseModel):
    """What a delivery says changed: in which repository, on which PRs and head branches, at which head."""

    event: str
    repo: str = ""  # owner/name (repository.full_name)
    pr_numbers: list[int] = Field(default_factory=list)
    branches: list[str] = Field(default_factory=list)  # head branches the change is on
    head_sha: str | None = None


def _pulls(items: Any) -> tuple[list[int], list[str]]:
    numbers, branches = [], []
    for p in items if isinstance(items, list) else []:
        if isinstance(p, dict):
            if isinstance(p.get("number"), int):
                numbers.append(p["number"])
            ref = (p.get("head") or {}).get("ref")
            if isinstance(ref, str) and ref:
                branches.append(ref)
    return numbers, branches


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def pull_request_event(event: str, payload: dict[str, Any]) -> PullRequestEvent | None:
    """The PRs/branches a ``check_run``, ``check_suite``, ``status``, ``pull_request`` or
    ``pull_request_review`` payload is about (GitHub's shapes), or the PR an ``/approve-merge`` comment
    was written on (``issue_comment``: its number only, a comment names no branch), or the branch a
    ``delete`` event deleted (``ref_type`` branch; a deleted tag wakes nothing); None for any other
    event or comment."""
    if event not in WAKING_EVENTS:
        return None
    if event == "delete":  # a branch (or tag) deleted: the build whose branch it was reads GitHub now
        ref = _str(payload.get("ref"))
        if payload.get("ref_type") != "branch" or ref is None:
            return None
        repo = _str((payload.get("repository") or {}).get("full_name")) or ""
        return PullRequestEvent(event=event, repo=repo, branches=[ref])
    if event == "push":  # a branch moved (a push or a force push): the build whose branch it is reads now
        ref = _str(payload.get("ref")) or ""
        if not ref.startswith("refs/heads/"):
            return None  # a tag push wakes nothing
        repo = _str((payload.get("repository") or {}).get("full_name")) or ""
        return PullRequestEvent(event=event, repo=repo, branches=[ref.removeprefix("refs/heads/")],
                                head_sha=_str(payload.get("after")))
    if event == "issue_comment":
        issue, comment = payload.get("issue") or {}, payload.get("comment") or {}
        number = issue.get("number")
        if (payload.get("action") not in ("created", "edited") or not issue.get("pull_request")
                or not isinstance(number, int) or not is_approve_command(_str(comment.get("body")) or "")):
            return None  # only an operator's command on a PR may change a merge wait
        repo = _str((payload.get("repository") or {}).get("full_name")) or ""
        return PullRequestEvent(event=event, repo=repo, pr_numbers=[number])
    repo = _str((payload.get("repository") or {}).get("full_name")) or ""
    numbers: list[int] = []
    branches: list[str] = []
    sha: str | None = None
    if event in ("check_run", "check_suite"):
        obj = payload.get(event) or {}
        numbers, branches = _pulls(obj.get("pull_requests"))
        sha = _str(obj.get("head_sha"))
        suite_branch = _str(obj.get("head_branch")) or _str((obj.get("check_suite") or {}).get("head_branch"))
        if suite_branch:
            branches.append(suite_branch)
    elif event == "status":  # a commit status names the commit and the branches whose head it is
        sha = _str(payload.get("sha"))
        branches = [b["name"] for b in payload.get("branches") or [] if isinstance(b, dict) and _str(b.get("name"))]
    else:  # pull_request, pull_request_review
        numbers, branches = _pulls([payload.get("pull_request")])
        sha = _str(((payload.get("pull_request") or {}).get("head") or {}).get("sha"))
    return PullRequestEvent(event=event, repo=repo, pr_numbers=sorted(set(numbers)),
                            branches=sorted(set(branches)), head_sha=sha)
