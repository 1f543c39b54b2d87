"""A local GitHub REST v3 stand-in over real bare git repos.

Why: the PR / checks / merge part of the workflow must run end to end without github.com. This is a
real HTTP server (stdlib ``ThreadingHTTPServer``) speaking the subset of REST v3 that
``clients.github`` uses, with GitHub's status codes and messages for the failure paths (401, 404,
405, 409, 422, rate limits). Pull heads are read live from the bare repo, and a merge is a real merge
commit pushed into the base branch.

Run in a thread (default) or as a subprocess: ``python -m sandbox.github_standin --state-dir D
--remote owner/name=/path/to/bare.git`` with the token in ``GITHUB_STANDIN_TOKEN``; it prints
``api_url=<url>`` on its first stdout line. Test-only knobs (checks, reviews, forced rate limits) are
HTTP admin endpoints under ``/_admin/`` (same token), wrapped by ``GitHubStandinHandle`` methods.

Conditional requests as on GitHub: every 200 answer to a GET carries a weak ``ETag`` (``W/"..."``, over
the body as the requesting token sees it); ``If-None-Match`` naming it is answered ``304 Not Modified``
with no body. ``X-RateLimit-*`` report an hourly window that every answer but a 304 is charged to
(``request_stats`` counts both kinds; ``set_rate_budget`` sets the window and enforces it).

Identities: the stand-in's own token is a classic token (``X-OAuth-Scopes: repo, workflow``) owned by
``gpu-rl-builder-bot``; ``add_token`` accepts more tokens with their own owner, scopes (classic) or
fine-grained permissions. ``register_app`` makes a GitHub App installation: ``POST
/app/installations/{id}/access_tokens`` verifies the App's JWT against its public key (RS256, issuer
= app id, at most 10 minutes) and mints an installation token with the installation's permissions,
which every endpoint then enforces (403 "Resource not accessible by integration"); ``GET /user``
refuses installation tokens as GitHub does. Tokens live in memory only, never in the state file.

Webhooks as GitHub delivers them (``set_webhook``): a changed check run (``check_run``), commit status
(``status``), review (``pull_request_review``), comment (``issue_comment``) or PR (``pull_request``: opened,
edited, closed,
reopened) or a deleted branch (``delete``) is POSTed to the configured URL, in the background and in order, with GitHub's headers (``X-GitHub-Event``,
``X-GitHub-Delivery``, ``X-Hub-Signature-256`` = HMAC-SHA256 of the body with the webhook secret) and
payload shapes (the PRs a check or review belongs to, the branches a status's commit heads).
``webhook_deliveries`` lists each with the answer's status; ``redeliver`` sends one again with the same
delivery id, as GitHub's "Redeliver" does. A push through ``push_as`` (someone moving a branch) is recorded in the
repository activity (``GET /activity``: who, when, ``push``/``force_push``) and sends ``push`` and ``pull_request``
``synchronize``; a plain ``git push`` to the bare repo sends nothing (the poll sees it) and names no one.

Done by someone else, as on GitHub: who closed or merged a PR is the token's owner (the PR's
``merged_by``, the issue's ``closed_by``); deleting a PR's head branch (``DELETE /git/refs/heads/..``,
or a ``git push --delete`` seen on the next read) closes the PR unmerged and sends ``delete`` and
``pull_request`` ``closed``; ``GET /branches/{b}`` answers 404 "Branch not found" for a missing branch.
"""

from __future__ import annotations

import argparse
import atexit
import base64
import hashlib
import hmac
import json
import os
import queue
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

import git
import jwt

TOKEN_ENV = "GITHUB_STANDIN_TOKEN"
DEFAULT_LOGIN = "gpu-rl-builder-bot"
INTEGRATION_403 = "Resource not accessible by integration"
# (method, path regex relative to /repos/{o}/{r}) -> (permission, level) a restricted token needs.
_PERMISSIONS: list[tuple[str, str, str, str]] = [
    ("GET", r"", "metadata", "read"),
    ("GET", r"/issues/\d+(/comments)?", "issues", "read"),
    ("POST", r"/issues/\d+/comments", "issues", "write"),
    ("PATCH", r"/issues/comments/\d+", "issues", "write"),
    ("GET", r"/pulls(/\d+(/reviews)?)?", "pull_requests", "read"),
    ("GET", r"/branches/[^/]+", "contents", "read"),
    ("GET", r"/contents/.+", "contents", "read"),
    ("GET", r"/activity", "metadata", "read"),
    ("DELETE", r"/git/refs/.+", "contents", "write"),
    ("POST", r"/pulls", "pull_requests", "write"),
    ("PATCH", r"/pulls/\d+", "pull_requests", "write"),
    ("PUT", r"/pulls/\d+/merge", "contents", "write"),
    ("GET", r"/commits/[^/]+/check-runs", "checks", "read"),
    ("GET", r"/commits/[^/]+/status", "statuses", "read"),
    ("POST", r"/statuses/[^/]+", "statuses", "write"),
]
DOCS = "https://docs.github.com/rest"


class _HttpError(Exception):
    def __init__(self, status: int, message: str, *, errors: list[dict[str, Any]] | None = None,
                 headers: dict[str, str] | None = None):
        self.status, self.message, self.errors, self.headers = status, message, errors, headers or {}
        super().__init__(message)

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"message": self.message, "documentation_url": DOCS}
        if self.errors is not None:
            out["errors"] = self.errors
        return out


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------- state


@dataclass
class _Store:
    """Everything the stand-in remembers; persisted to ``state_dir/github.json`` (never the token)."""

    pulls: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)  # repo -> number -> pull
    comments: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)  # repo -> id -> comment
    checks: dict[str, dict[str, dict[str, dict[str, Any]]]] = field(default_factory=dict)  # repo->sha->name
    statuses: dict[str, dict[str, dict[str, dict[str, Any]]]] = field(default_factory=dict)  # repo->sha->ctx
    reviews: dict[str, dict[str, list[dict[str, Any]]]] = field(default_factory=dict)  # repo -> number
    permissions: dict[str, dict[str, bool]] = field(default_factory=dict)  # repo -> the token's permissions
    issues: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)  # repo -> number -> overrides
    protection: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)  # repo -> branch -> settings
    rulesets: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # repo -> active rulesets
    collaborators: dict[str, dict[str, str]] = field(default_factory=dict)  # repo -> login -> permission
    teams: dict[str, list[str]] = field(default_factory=dict)  # "org/slug" -> member logins
    activity: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # repo -> pushes, oldest first
    next_id: int = 1000
    next_number: dict[str, int] = field(default_factory=dict)  # repo -> next issue/PR number

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id


class GitHubStandin:
    """The request handling logic, independent of HTTP plumbing."""

    def __init__(self, state_dir: Path, remotes: dict[str, str], token: str, *, auto_green: bool = False):
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.remotes = {k: str(v) for k, v in remotes.items()}
        self.token = token
        self.auto_green = auto_green
        self.base_url = ""  # set once the server is bound
        self.lock = threading.RLock()
        self.forced_limit = {"n": 0, "status": 403}
        self.slow: dict[str, float] = {}  # "METHOD path-regex" -> seconds to wait before answering
        self.store = self._load()
        # token -> identity: login (None for an installation), scopes (classic: list; else None),
        # permissions (None: everything; else {"contents": "write", ...}), expires_at (epoch s or None).
        self.tokens: dict[str, dict[str, Any]] = {token: {"login": DEFAULT_LOGIN, "scopes": ["repo", "workflow"],
                                                          "permissions": None, "expires_at": None}}
        self.apps: dict[str, dict[str, Any]] = {}  # app id -> {"public_key", "installations": {id: {...}}}
        self.minted = 0
        self._auto_green_at: dict[str, str] = {}
        # API requests served (admin calls excluded): all, answered 304, and sent with If-None-Match.
        # Everything but a 304 counts against the primary rate limit, as on GitHub.
        self.stats = {"requests": 0, "not_modified": 0, "conditional": 0}
        self.served: dict[str, int] = {}  # "METHOD /path" -> API requests received to be answered (any status)
        # "METHOD /path" -> API requests whose answer was read from the state (after any slow_down): a change
        # made after this count moved cannot be in that answer.
        self.answered: dict[str, int] = {}
        # The primary rate limit: one hourly window shared by every token (GitHub's is per user/App).
        # Reported truthfully in X-RateLimit-* on every answer; enforced (403 at 0) once admin set it.
        self.budget = {"limit": 5000, "used": 0, "reset": int(time.time()) + 3600, "enforce": False}
        # Webhook: {"url", "secret"} (memory only, like tokens), its deliveries, and the delivering thread.
        self.webhook: dict[str, str] | None = None
        self.deliveries: list[dict[str, Any]] = []
        self._outbox: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._deliver_loop, name="github-standin-webhooks", daemon=True).start()

    # -- persistence

    @property
    def _state_file(self) -> Path:
        return self.state_dir / "github.json"

    def _load(self) -> _Store:
        if self._state_file.exists():
            return _Store(**json.loads(self._state_file.read_text()))
        return _Store()

    def _save(self) -> None:
        tmp = self._state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.store.__dict__, indent=1, sort_keys=True))
        tmp.replace(self._state_file)

    # -- git

    def _git(self, repo: str) -> git.Repo:
        if repo not in self.remotes:
            raise _HttpError(404, "Not Found")
        return git.Repo(self.remotes[repo])

    def _branch_sha(self, repo: str, branch: str) -> str | None:
        try:
            return self._git(repo).git.rev_parse("--verify", "--quiet", f"refs/heads/{branch}^{{commit}}")
        except git.GitCommandError:
            return None

    def _resolve_ref(self, repo: str, ref: str) -> str:
        try:
            return self._git(repo).git.rev_parse("--verify", "--quiet", f"{ref}^{{commit}}")
        except git.GitCommandError:
            raise _HttpError(422, f"No commit found for SHA: {ref}") from None

    def _mergeable(self, repo: str, base_sha: str, head_sha: str) -> bool:
        try:
            self._git(repo).git.merge_tree("--write-tree", base_sha, head_sha)
            return True
        except git.GitCommandError as exc:
            if exc.status == 1:  # conflicts
                return False
            raise

    def _is_ancestor(self, repo: str, a: str, b: str) -> bool:
        try:
            self._git(repo).git.merge_base("--is-ancestor", a, b)
            return True
        except git.GitCommandError:
            return False

    # -- rendering

    def _pull_json(self, repo: str, p: dict[str, Any]) -> dict[str, Any]:
        owner = repo.split("/")[0]
        if p["state"] == "open" and self._branch_sha(repo, p["head"]) is None:
            self._head_deleted(repo, p, None)  # deleted by a git push: GitHub closes the PR as it sees it
        head_sha = self._branch_sha(repo, p["head"]) or p["head_sha"]
        base_sha = self._branch_sha(repo, p["base"]) or p["base_sha"]
        if p["state"] == "open":
            p["head_sha"], p["base_sha"] = head_sha, base_sha
            mergeable: bool | None = self._mergeable(repo, base_sha, head_sha)
        else:
            mergeable = None
        return {
            "url": f"{self.base_url}/repos/{repo}/pulls/{p['number']}",
            "html_url": f"{self.base_url}/{repo}/pull/{p['number']}",
            "id": p["id"], "number": p["number"], "state": p["state"], "title": p["title"],
            "body": p["body"], "user": {"login": owner},
            "created_at": p["created_at"], "updated_at": p["updated_at"],
            "closed_at": p.get("closed_at"), "merged_at": p.get("merged_at"),
            "merged": p["merged"], "mergeable": mergeable,
            "merged_by": {"login": p["merged_by"], "type": "User"} if p.get("merged_by") else None,
            "mergeable_state": "unknown" if mergeable is None else ("clean" if mergeable else "dirty"),
            "merge_commit_sha": p.get("merge_commit_sha"),
            "head": {"label": f"{owner}:{p['head']}", "ref": p["head"], "sha": head_sha,
                     "repo": {"full_name": repo}},
            "base": {"label": f"{owner}:{p['base']}", "ref": p["base"], "sha": base_sha,
                     "repo": {"full_name": repo}},
        }

    def _pull(self, repo: str, number: str) -> dict[str, Any]:
        p = self.store.pulls.get(repo, {}).get(str(number))
        if p is None:
            raise _HttpError(404, "Not Found")
        return p

    # -- endpoints: pulls

    def list_pulls(self, repo: str, q: dict[str, str]) -> list[dict[str, Any]]:
        self._git(repo)
        state = q.get("state", "open")
        head = q.get("head")
        base = q.get("base")
        out = []
        for p in sorted(self.store.pulls.get(repo, {}).values(), key=lambda p: -p["number"]):
            if state != "all" and p["state"] != state:
                continue
            if head and head != f"{repo.split('/')[0]}:{p['head']}":
                continue
            if base and base != p["base"]:
                continue
            out.append(self._pull_json(repo, p))
        return out

    def create_pull(self, repo: str, body: dict[str, Any]) -> dict[str, Any]:
        self._git(repo)
        owner = repo.split("/")[0]
        head, base, title = body.get("head"), body.get("base"), body.get("title")
        missing = [f for f in ("head", "base", "title") if not body.get(f)]
        if missing:
            raise _HttpError(422, "Validation Failed", errors=[
                {"resource": "PullRequest", "field": f, "code": "missing_field"} for f in missing])
        if ":" in head:
            head_owner, head = head.split(":", 1)
            if head_owner != owner:
                raise _HttpError(422, "Validation Failed",
                                 errors=[{"resource": "PullRequest", "field": "head", "code": "invalid"}])
        head_sha, base_sha = self._branch_sha(repo, head), self._branch_sha(repo, base)
        invalid = [f for f, sha in (("base", base_sha), ("head", head_sha)) if sha is None]
        if invalid:
            raise _HttpError(422, "Validation Failed", errors=[
                {"resource": "PullRequest", "field": f, "code": "invalid"} for f in invalid])
        for p in self.store.pulls.get(repo, {}).values():
            if p["state"] == "open" and p["head"] == head and p["base"] == base:
                raise _HttpError(422, "Validation Failed", errors=[{
                    "resource": "PullRequest", "code": "custom",
                    "message": f"A pull request already exists for {owner}:{head}."}])
        if self._is_ancestor(repo, head_sha, base_sha):
            raise _HttpError(422, "Validation Failed", errors=[{
                "resource": "PullRequest", "code": "custom",
                "message": f"No commits between {base} and {head}"}])
        number = self.store.next_number.get(repo, 1)
        self.store.next_number[repo] = number + 1
        p = {"id": self.store.new_id(), "number": number, "state": "open", "title": title,
             "body": body.get("body"), "head": head, "base": base, "head_sha": head_sha, "base_sha": base_sha,
             "merged": False, "merge_commit_sha": None, "created_at": _now(), "updated_at": _now()}
        self.store.pulls.setdefault(repo, {})[str(number)] = p
        self._save()
        out = self._pull_json(repo, p)
        self._hook("pull_request", repo, {"action": "opened", "number": number, "pull_request": out})
        return out

    def update_pull(self, repo: str, number: str, body: dict[str, Any], who: dict[str, Any] | None = None
                    ) -> dict[str, Any]:
        p = self._pull(repo, number)
        for key in ("title", "body"):
            if key in body and body[key] is not None:
                p[key] = body[key]
        if body.get("state") == "open" and p["state"] == "closed" and not p["merged"] \
                and self._branch_sha(repo, p["head"]) is None:
            raise _HttpError(422, "Validation Failed", errors=[{  # GitHub: restore the branch first
                "resource": "PullRequest", "code": "custom", "message": "state cannot be changed. The "
                f"{p['head']} branch has been deleted."}])
        if body.get("state") in ("open", "closed") and not p["merged"]:
            p["state"] = body["state"]
            p["closed_at"] = _now() if body["state"] == "closed" else None
            p["closed_by"] = _login(who) if body["state"] == "closed" else None
        p["updated_at"] = _now()
        self._save()
        out = self._pull_json(repo, p)
        action = "closed" if body.get("state") == "closed" else "reopened" if body.get("state") == "open" else "edited"
        self._hook("pull_request", repo, {"action": action, "number": p["number"], "pull_request": out}, who)
        return out

    def _head_deleted(self, repo: str, p: dict[str, Any], who: dict[str, Any] | None) -> None:
        """Its head branch is gone: GitHub closes the PR unmerged (closed by whoever deleted the branch)."""
        p.update(state="closed", closed_at=_now(), updated_at=_now(), closed_by=_login(who) if who else None)
        self._save()
        self._hook("pull_request", repo, {"action": "closed", "number": p["number"],
                                          "pull_request": self._pull_json(repo, p)}, who)

    def get_branch(self, repo: str, branch: str) -> dict[str, Any]:
        sha = self._branch_sha(repo, branch)
        if sha is None:
            raise _HttpError(404, "Branch not found")
        return {"name": branch, "commit": {"sha": sha}, "protected": branch in self.store.protection.get(repo, {})}

    def delete_ref(self, repo: str, ref: str, who: dict[str, Any]) -> None:
        """``DELETE /repos/{o}/{r}/git/refs/{ref}`` (204; 422 "Reference does not exist"). A deleted branch
        closes the open PRs whose head it was and sends ``delete`` (then ``pull_request`` closed)."""
        g = self._git(repo)
        try:
            g.git.rev_parse("--verify", "--quiet", f"refs/{ref}")
        except git.GitCommandError:
            raise _HttpError(422, "Reference does not exist") from None
        g.git.update_ref("-d", f"refs/{ref}")
        kind, _, name = ref.partition("/")
        self._hook("delete", repo, {"ref": name, "ref_type": "branch" if kind == "heads" else "tag",
                                    "pusher_type": "user"}, who)
        if kind == "heads":
            for p in self.store.pulls.get(repo, {}).values():
                if p["state"] == "open" and p["head"] == name:
                    self._head_deleted(repo, p, who)

    def admin_push(self, body: dict[str, Any]) -> dict[str, Any]:
        """Someone (``login``) pushes ``sha`` (already in the repo) to ``branch``, as ``git push [--force]``
        would: the ref moves, GitHub's repository activity records who and when (``push``, or ``force_push``
        when the old head is not an ancestor), and ``push`` then ``pull_request`` ``synchronize`` (for each
        open PR whose head it is) are delivered."""
        repo, branch, login = body["repo"], body["branch"], body["login"]
        after = self._resolve_ref(repo, body["sha"])
        before = self._branch_sha(repo, branch)
        self._git(repo).git.update_ref(f"refs/heads/{branch}", after)
        forced = before is not None and not self._is_ancestor(repo, before, after)
        who = {"login": login}
        entry = {"id": self.store.new_id(), "node_id": f"RA_{self.store.next_id}", "before": before or "0" * 40,
                 "after": after, "ref": f"refs/heads/{branch}", "timestamp": _now(),
                 "activity_type": "force_push" if forced else ("push" if before else "branch_creation"),
                 "actor": {"login": login, "type": "User"}}
        self.store.activity.setdefault(repo, []).append(entry)
        self._save()
        self._hook("push", repo, {"ref": f"refs/heads/{branch}", "before": before or "0" * 40, "after": after,
                                  "forced": forced, "pusher": {"name": login}}, who)
        for p in self.store.pulls.get(repo, {}).values():
            if p["state"] == "open" and p["head"] == branch:
                self._hook("pull_request", repo, {"action": "synchronize", "number": p["number"],
                                                  "before": before, "after": after,
                                                  "pull_request": self._pull_json(repo, p)}, who)
        return entry

    def list_activity(self, repo: str, q: dict[str, str]) -> list[dict[str, Any]]:
        """``GET /repos/{o}/{r}/activity``: pushes newest first, filtered by ``ref`` (full or short name)."""
        self._git(repo)
        ref = q.get("ref")
        if ref and not ref.startswith("refs/"):
            ref = f"refs/heads/{ref}"
        items = [a for a in self.store.activity.get(repo, []) if ref is None or a["ref"] == ref]
        return list(reversed(items)) if q.get("direction", "desc") == "desc" else items

    def get_contents(self, repo: str, path: str, q: dict[str, str]) -> dict[str, Any]:
        """``GET /repos/{o}/{r}/contents/{path}?ref=``: a file's content (base64), 404 when absent."""
        g = self._git(repo)
        ref = q.get("ref") or "HEAD"
        try:
            blob = g.git.rev_parse("--verify", "--quiet", f"{ref}:{path}")
            data = g.git.cat_file("blob", blob, stdout_as_string=False)
        except git.GitCommandError:
            raise _HttpError(404, "Not Found") from None
        return {"type": "file", "encoding": "base64", "path": path, "name": path.rsplit("/", 1)[-1], "sha": blob,
                "size": len(data), "content": base64.b64encode(data).decode()}

    def merge_pull(self, repo: str, number: str, body: dict[str, Any], who: dict[str, Any] | None = None
                   ) -> dict[str, Any]:
        p = self._pull(repo, number)
        if p["state"] != "open":
            raise _HttpError(405, "Pull Request is not mergeable")
        head_sha = self._branch_sha(repo, p["head"])
        base_sha = self._branch_sha(repo, p["base"])
        if head_sha is None or base_sha is None:
            raise _HttpError(405, "Pull Request is not mergeable")
        if body.get("sha") and body["sha"] != head_sha:
            raise _HttpError(409, "Head branch was modified. Review and try the merge again.")
        if not self._mergeable(repo, base_sha, head_sha) or self._is_ancestor(repo, head_sha, base_sha):
            raise _HttpError(405, "Pull Request is not mergeable")  # conflicts, or nothing left to merge
        method = body.get("merge_method", "merge")
        if method not in ("merge", "squash"):
            raise _HttpError(422, "Validation Failed",
                             errors=[{"resource": "PullRequest", "field": "merge_method", "code": "invalid"}])
        owner = repo.split("/")[0]
        title = body.get("commit_title") or (
            f"Merge pull request #{p['number']} from {owner}/{p['head']}" if method == "merge"
            else f"{p['title']} (#{p['number']})")
        message = title + "\n\n" + (body.get("commit_message") or p["title"])
        merge_sha = self._merge_in_clone(repo, p["base"], head_sha, method, message)
        p.update(state="closed", merged=True, merge_commit_sha=merge_sha, merged_at=_now(), closed_at=_now(),
                 head_sha=head_sha, base_sha=merge_sha, updated_at=_now(), merged_by=_login(who),
                 closed_by=_login(who))
        self._save()
        self._hook("pull_request", repo, {"action": "closed", "number": p["number"],
                                          "pull_request": self._pull_json(repo, p)}, who)
        return {"sha": merge_sha, "merged": True, "message": "Pull Request successfully merged"}

    def _merge_in_clone(self, repo: str, base: str, head_sha: str, method: str, message: str) -> str:
        with tempfile.TemporaryDirectory(prefix="gh-standin-merge-") as tmp:
            clone = git.Repo.clone_from(self.remotes[repo], tmp, branch=base)
            with clone.config_writer() as cw:
                cw.set_value("user", "name", "GitHub Stand-in")
                cw.set_value("user", "email", "noreply@github-standin.invalid")
            if method == "merge":
                clone.git.merge("--no-ff", "-m", message, head_sha)
            else:
                clone.git.merge("--squash", head_sha)
                clone.git.commit("-m", message)
            clone.git.push("origin", f"HEAD:refs/heads/{base}")
            return clone.head.commit.hexsha

    def reviews(self, repo: str, number: str) -> list[dict[str, Any]]:
        self._pull(repo, number)
        return self.store.reviews.get(repo, {}).get(str(number), [])

    # -- endpoints: issue comments

    def _comment_json(self, repo: str, c: dict[str, Any]) -> dict[str, Any]:
        return {**c, "url": f"{self.base_url}/repos/{repo}/issues/comments/{c['id']}",
                "html_url": f"{self.base_url}/{repo}/issues/{c['issue_number']}#issuecomment-{c['id']}",
                "user": {"login": c.get("user") or repo.split("/")[0]}}  # the token's own login: the owner

    def add_comment(self, repo: str, issue: str, body: dict[str, Any]) -> dict[str, Any]:
        known = self.get_issue(repo, issue)  # a missing issue: 404, as GitHub answers
        if known["locked"]:
            raise _HttpError(403, "Unable to create comment because issue is locked.")
        if not body.get("body"):
            raise _HttpError(422, "Validation Failed",
                             errors=[{"resource": "IssueComment", "field": "body", "code": "missing_field"}])
        c = {"id": self.store.new_id(), "issue_number": int(issue), "body": body["body"],
             "created_at": _now(), "updated_at": _now()}
        self.store.comments.setdefault(repo, {})[str(c["id"])] = c
        self._save()
        self._comment_hook(repo, c)
        return self._comment_json(repo, c)

    def _comment_hook(self, repo: str, c: dict[str, Any]) -> None:
        """``issue_comment`` (created) as GitHub sends it: the issue, with ``pull_request`` when it is a PR."""
        number = str(c["issue_number"])
        issue: dict[str, Any] = {"number": int(number)}
        if number in self.store.pulls.get(repo, {}):
            issue["pull_request"] = {"url": f"{self.base_url}/repos/{repo}/pulls/{number}"}
        self._hook("issue_comment", repo, {"action": "created", "issue": issue,
                                           "comment": self._comment_json(repo, c)})

    def list_comments(self, repo: str, issue: str) -> list[dict[str, Any]]:
        self._git(repo)
        cs = [c for c in self.store.comments.get(repo, {}).values() if c["issue_number"] == int(issue)]
        return [self._comment_json(repo, c) for c in sorted(cs, key=lambda c: c["id"])]

    def update_comment(self, repo: str, cid: str, body: dict[str, Any]) -> dict[str, Any]:
        c = self.store.comments.get(repo, {}).get(str(cid))
        if c is None:
            raise _HttpError(404, "Not Found")
        if not body.get("body"):
            raise _HttpError(422, "Validation Failed",
                             errors=[{"resource": "IssueComment", "field": "body", "code": "missing_field"}])
        c.update(body=body["body"], updated_at=_now())
        self._save()
        return self._comment_json(repo, c)

    # -- endpoints: branch protection, rulesets, collaborators, teams (the merge gate's reads)

    def _can_admin(self, repo: str) -> bool:
        return bool((self.store.permissions.get(repo) or {}).get("admin"))

    def protection_required_checks(self, repo: str, branch: str) -> dict[str, Any]:
        """GitHub's answers: 403 without admin (what most tokens get), 404 "Branch not protected" /
        "Required status checks not enabled", else the required contexts and checks."""
        self._git(repo)
        if self._branch_sha(repo, branch) is None:
            raise _HttpError(404, "Branch not found")
        if not self._can_admin(repo):
            raise _HttpError(403, "Resource not accessible by integration")
        prot = self.store.protection.get(repo, {}).get(branch)
        if prot is None:
            raise _HttpError(404, "Branch not protected")
        if prot.get("contexts") is None:
            raise _HttpError(404, "Required status checks not enabled")
        url = f"{self.base_url}/repos/{repo}/branches/{branch}/protection/required_status_checks"
        return {"url": url, "strict": bool(prot.get("strict")), "contexts": list(prot["contexts"]),
                "checks": [{"context": c, "app_id": None} for c in prot["contexts"]],
                "contexts_url": f"{url}/contexts"}

    def branch_rules(self, repo: str, branch: str) -> list[dict[str, Any]]:
        """``GET /repos/{o}/{r}/rules/branches/{b}``: readable with read access; [] when nothing applies."""
        self._git(repo)
        out = []
        for rs in self.store.rulesets.get(repo, []):
            if branch in rs["branches"] and rs.get("enforcement", "active") == "active":
                out.append({"type": "required_status_checks", "ruleset_source_type": "Repository",
                            "ruleset_source": repo, "ruleset_id": rs["id"],
                            "parameters": {"strict_required_status_checks_policy": False,
                                           "do_not_enforce_on_create": False,
                                           "required_status_checks": [{"context": c} for c in rs["checks"]]}})
        return out

    def collaborator_permission(self, repo: str, login: str) -> dict[str, Any]:
        """Everyone not set otherwise can read (a public repository); the owner is admin."""
        self._git(repo)
        perm = self.store.collaborators.get(repo, {}).get(login.lower())
        if perm is None:
            perm = "admin" if login.lower() == repo.split("/")[0].lower() else "read"
        role = {"admin": "admin", "maintain": "maintain", "write": "write", "triage": "triage"}.get(perm, perm)
        legacy = {"maintain": "write", "triage": "read"}.get(perm, perm)
        return {"permission": legacy, "role_name": role, "user": {"login": login}}

    def team_membership(self, org: str, slug: str, login: str) -> dict[str, Any]:
        members = self.store.teams.get(f"{org}/{slug}")
        if members is None or login.lower() not in {m.lower() for m in members}:
            raise _HttpError(404, "Not Found")
        return {"url": f"{self.base_url}/orgs/{org}/teams/{slug}/memberships/{login}", "role": "member",
                "state": "active"}

    def admin_merge_gate(self, body: dict[str, Any]) -> dict[str, Any]:
        """Set branch protection, a ruleset, a collaborator's permission or a team's members."""
        repo = body.get("repo", "")
        if "protection" in body:  # {"branch": ..., "contexts": [...] | None} or None to unprotect
            prot = self.store.protection.setdefault(repo, {})
            if body["protection"] is None:
                prot.pop(body["branch"], None)
            else:
                prot[body["branch"]] = body["protection"]
        if "ruleset" in body:
            rs = {"id": self.store.new_id(), **body["ruleset"]}
            self.store.rulesets.setdefault(repo, []).append(rs)
        if "collaborator" in body:
            self.store.collaborators.setdefault(repo, {})[body["collaborator"].lower()] = body["permission"]
        if "team" in body:
            self.store.teams[body["team"]] = list(body["members"])
        self._save()
        return {"ok": True}

    def admin_add_comment(self, body: dict[str, Any]) -> dict[str, Any]:
        """A comment by another GitHub user (e.g. an operator's ``/approve-merge``)."""
        repo = body["repo"]
        c = {"id": self.store.new_id(), "issue_number": int(body["number"]), "body": body["body"],
             "user": body["user"], "created_at": _now(), "updated_at": _now()}
        self.store.comments.setdefault(repo, {})[str(c["id"])] = c
        self._save()
        self._comment_hook(repo, c)
        return self._comment_json(repo, c)

    # -- endpoints: checks and statuses

    def check_runs(self, repo: str, ref: str) -> list[dict[str, Any]]:
        sha = self._resolve_ref(repo, ref)
        runs = list(self.store.checks.get(repo, {}).get(sha, {}).values())
        if not runs and self.auto_green:
            at = self._auto_green_at.setdefault(sha, _now())  # one time per sha: the same answer every read
            runs = [{"id": 1, "name": "ci", "head_sha": sha, "status": "completed", "conclusion": "success",
                     "started_at": at, "completed_at": at}]
        return sorted(runs, key=lambda r: r["id"])

    def combined_status(self, repo: str, ref: str) -> dict[str, Any]:
        sha = self._resolve_ref(repo, ref)
        statuses = sorted(self.store.statuses.get(repo, {}).get(sha, {}).values(), key=lambda s: s["id"])
        states = {s["state"] for s in statuses}
        if states & {"failure", "error"}:
            state = "failure"
        elif not statuses or "pending" in states:
            state = "pending"
        else:
            state = "success"
        return {"state": state, "sha": sha, "total_count": len(statuses), "statuses": statuses,
                "repository": {"full_name": repo}}

    def create_status(self, repo: str, sha: str, body: dict[str, Any]) -> dict[str, Any]:
        sha = self._resolve_ref(repo, sha)
        if body.get("state") not in ("error", "failure", "pending", "success"):
            raise _HttpError(422, "Validation Failed",
                             errors=[{"resource": "Status", "field": "state", "code": "invalid"}])
        s = {"id": self.store.new_id(), "context": body.get("context") or "default", "state": body["state"],
             "description": body.get("description"), "target_url": body.get("target_url"),
             "created_at": _now(), "updated_at": _now()}
        self.store.statuses.setdefault(repo, {}).setdefault(sha, {})[s["context"]] = s
        self._save()
        self._hook("status", repo, {"sha": sha, "state": s["state"], "context": s["context"],
                                    "description": s["description"], "target_url": s["target_url"],
                                    "branches": [{"name": b, "commit": {"sha": sha}}
                                                 for b in self._branches_at(repo, sha)]})
        return s

    # -- admin

    def admin_set_check(self, body: dict[str, Any]) -> dict[str, Any]:
        repo = body["repo"]
        sha = self._resolve_ref(repo, body["sha"])
        by_name = self.store.checks.setdefault(repo, {}).setdefault(sha, {})
        old = by_name.get(body["name"])
        run = {"id": old["id"] if old else self.store.new_id(), "name": body["name"], "head_sha": sha,
               "status": body.get("status", "completed"), "conclusion": body.get("conclusion"),
               "started_at": _now(), "completed_at": _now() if body.get("status") == "completed" else None}
        by_name[body["name"]] = run
        self._save()
        self._hook("check_run", repo, {
            "action": "completed" if run["status"] == "completed" else "created",
            "check_run": {**run, "check_suite": {"head_sha": sha, "head_branch": None},
                          "pull_requests": [self._pull_ref(repo, p) for p in self._open_pulls_at(repo, sha)]}})
        return run

    def admin_add_review(self, body: dict[str, Any]) -> dict[str, Any]:
        repo, number = body["repo"], str(body["number"])
        p = self._pull(repo, number)
        review = {"id": self.store.new_id(), "state": body["state"], "body": body.get("body", ""),
                  "user": {"login": body.get("user", "reviewer")},
                  "commit_id": self._branch_sha(repo, p["head"]) or p["head_sha"], "submitted_at": _now()}
        self.store.reviews.setdefault(repo, {}).setdefault(number, []).append(review)
        self._save()
        self._hook("pull_request_review", repo, {"action": "submitted", "review": review,
                                                 "pull_request": self._pull_json(repo, p)})
        return review

    # -- webhooks

    def _open_pulls_at(self, repo: str, sha: str) -> list[dict[str, Any]]:
        return [p for p in self.store.pulls.get(repo, {}).values()
                if p["state"] == "open" and self._branch_sha(repo, p["head"]) == sha]

    def _pull_ref(self, repo: str, p: dict[str, Any]) -> dict[str, Any]:
        """A PR as a check run's ``pull_requests`` entry names it (number, head and base ref/sha)."""
        return {"number": p["number"], "url": f"{self.base_url}/repos/{repo}/pulls/{p['number']}",
                "head": {"ref": p["head"], "sha": self._branch_sha(repo, p["head"]) or p["head_sha"]},
                "base": {"ref": p["base"], "sha": self._branch_sha(repo, p["base"]) or p["base_sha"]}}

    def _branches_at(self, repo: str, sha: str) -> list[str]:
        out = self._git(repo).git.for_each_ref("--points-at", sha, "--format=%(refname:short)", "refs/heads")
        return sorted(b for b in out.splitlines() if b)

    def _hook(self, event: str, repo: str, payload: dict[str, Any], who: dict[str, Any] | None = None) -> None:
        """Queue a delivery of ``event`` (sent in the background, in order) if a webhook is configured."""
        if self.webhook is None:
            return
        owner, name = repo.split("/")
        body = json.dumps({**payload, "repository": {"full_name": repo, "name": name, "owner": {"login": owner}},
                           "sender": {"login": _login(who) if who else DEFAULT_LOGIN}}).encode()
        d = {"id": str(uuid.uuid4()), "event": event, "status": None, "attempts": 0, "body": body,
             "url": self.webhook["url"], "secret": self.webhook["secret"]}
        self.deliveries.append(d)
        self._outbox.put(d)

    def _deliver_loop(self) -> None:
        while True:
            self._send_delivery(self._outbox.get())

    @staticmethod
    def _send_delivery(d: dict[str, Any]) -> int:
        sig = "sha256=" + hmac.new(d["secret"].encode(), d["body"], hashlib.sha256).hexdigest()
        req = urllib.request.Request(d["url"], data=d["body"], method="POST", headers={
            "Content-Type": "application/json", "User-Agent": "GitHub-Hookshot/standin",
            "X-GitHub-Event": d["event"], "X-GitHub-Delivery": d["id"], "X-GitHub-Hook-ID": "1",
            "X-Hub-Signature-256": sig})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                status = resp.status
        except urllib.error.HTTPError as exc:
            status = exc.code
        except OSError:
            status = 0  # unreachable: GitHub shows the delivery as failed
        d["attempts"] += 1
        d["status"] = status
        return status

    def admin_webhook(self, body: dict[str, Any]) -> dict[str, Any]:
        """Deliver to ``url`` signed with ``secret`` from now on (``url`` None: stop delivering)."""
        self.webhook = {"url": body["url"], "secret": body["secret"]} if body.get("url") else None
        return {"ok": True}

    def admin_webhook_deliveries(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        return [{k: d[k] for k in ("id", "event", "status", "attempts")} | {"payload": json.loads(d["body"])}
                for d in self.deliveries]

    def admin_redeliver(self, body: dict[str, Any]) -> dict[str, Any]:
        """Send delivery ``id`` again, now, with the same delivery id and body (GitHub's "Redeliver")."""
        d = next((d for d in self.deliveries if d["id"] == body["id"]), None)
        if d is None:
            raise _HttpError(404, "Not Found")
        return {"id": d["id"], "status": self._send_delivery(d), "attempts": d["attempts"]}

    def admin_rate_limit(self, body: dict[str, Any]) -> dict[str, Any]:
        status = int(body.get("status", 403))
        if status not in (403, 429):
            raise _HttpError(422, "status must be 403 or 429")
        self.forced_limit = {"n": int(body["n"]), "status": status}
        return dict(self.forced_limit)

    def admin_slow(self, body: dict[str, Any]) -> dict[str, Any]:
        key = f"{body['method'].upper()} {body['path']}"
        if float(body.get("seconds", 0)) > 0:
            self.slow[key] = float(body["seconds"])
        else:
            self.slow.pop(key, None)
        return dict(self.slow)

    def take_slow(self, method: str, path: str) -> None:
        for key, seconds in list(self.slow.items()):
            m, _, pattern = key.partition(" ")
            if m == method and re.search(pattern, path):
                time.sleep(seconds)

    def admin_permissions(self, body: dict[str, Any]) -> dict[str, Any]:
        self.store.permissions[body["repo"]] = {k: bool(v) for k, v in body["permissions"].items()}
        self._save()
        return self.store.permissions[body["repo"]]

    def admin_issue(self, body: dict[str, Any]) -> dict[str, Any]:
        issue = {"state": body.get("state", "open"), "locked": bool(body.get("locked", False))}
        if body.get("missing"):
            self.store.issues.setdefault(body["repo"], {})[str(body["number"])] = {"missing": True}
        else:
            self.store.issues.setdefault(body["repo"], {})[str(body["number"])] = issue
        self._save()
        return issue

    # -- endpoints: repository and issues (what a token may do, where it may comment)

    def get_repo(self, repo: str) -> dict[str, Any]:
        self._git(repo)
        owner, name = repo.split("/")
        perms = self.store.permissions.get(repo) or {"admin": False, "maintain": False, "push": True,
                                                      "triage": True, "pull": True}
        return {"id": abs(hash(repo)) % 10**8, "name": name, "full_name": repo, "owner": {"login": owner},
                "private": False, "default_branch": self._git(repo).git.symbolic_ref("--short", "HEAD"),
                "html_url": f"{self.base_url}/{repo}", "permissions": perms}

    def get_issue(self, repo: str, number: str) -> dict[str, Any]:
        """Every issue number exists (open, unlocked) unless an admin call said otherwise. A PR is an issue
        too, with its state and ``closed_by`` (only here: GitHub's pull object does not name the closer)."""
        self._git(repo)
        p = self.store.pulls.get(repo, {}).get(str(number))
        if p is not None:
            self._pull_json(repo, p)  # a head deleted by a push closes it first, as on GitHub
            return {"number": int(number), "state": p["state"], "locked": False,
                    "html_url": f"{self.base_url}/{repo}/pull/{number}", "closed_at": p.get("closed_at"),
                    "closed_by": {"login": p["closed_by"], "type": "User"} if p.get("closed_by") else None,
                    "pull_request": {"url": f"{self.base_url}/repos/{repo}/pulls/{number}",
                                     "merged_at": p.get("merged_at")}}
        known = self.store.issues.get(repo, {}).get(str(number), {"state": "open", "locked": False})
        if known.get("missing"):
            raise _HttpError(404, "Not Found")
        return {"number": int(number), "state": known["state"], "locked": known["locked"],
                "html_url": f"{self.base_url}/{repo}/issues/{number}"}

    # -- request dispatch

    def check_auth(self, authorization: str | None, path: str = "") -> dict[str, Any]:
        """The identity behind the request's token (401 otherwise). ``/app/`` takes an App JWT;
        ``/_admin/`` only the stand-in's own token."""
        scheme, _, presented = (authorization or "").partition(" ")
        if scheme.lower() not in ("bearer", "token"):
            raise _HttpError(401, "Bad credentials")
        if path.startswith("/app/"):
            return self._check_app_jwt(presented)
        if path.startswith("/_admin/"):
            if not secrets.compare_digest(presented, self.token):
                raise _HttpError(401, "Bad credentials")
            return self.tokens[self.token]
        who = next((v for k, v in self.tokens.items() if secrets.compare_digest(presented, k)), None)
        if who is None or (who["expires_at"] is not None and who["expires_at"] <= time.time()):
            raise _HttpError(401, "Bad credentials")
        return who

    def _check_app_jwt(self, presented: str) -> dict[str, Any]:
        try:
            issuer = str(jwt.decode(presented, options={"verify_signature": False}).get("iss"))
        except jwt.PyJWTError:
            raise _HttpError(401, "A JSON web token could not be decoded") from None
        app = self.apps.get(issuer)
        if app is None:
            raise _HttpError(401, "Integration not found")
        try:
            claims = jwt.decode(presented, app["public_key"], algorithms=["RS256"],
                                options={"require": ["iat", "exp", "iss"]}, leeway=60)
        except jwt.PyJWTError as e:
            raise _HttpError(401, f"'{type(e).__name__}' while verifying the JWT") from None
        if claims["exp"] - claims["iat"] > 660:
            raise _HttpError(401, "'Expiration time' claim ('exp') is too far in the future")
        return {"app_id": issuer, "login": None, "scopes": None, "permissions": {}, "expires_at": None}

    def authorize(self, who: dict[str, Any], method: str, path: str) -> None:
        """A token with listed permissions (installation, fine-grained) may only do what they grant."""
        granted = who.get("permissions")
        m = re.fullmatch(r"/repos/[^/]+/[^/]+(?P<rest>/.*)?", path)
        if granted is None or m is None:
            return
        rest = m["rest"] or ""
        for verb, pattern, name, level in _PERMISSIONS:
            if verb == method and re.fullmatch(pattern, rest):
                have = granted.get(name, "read" if name == "metadata" else None)
                if have not in (("write", "admin") if level == "write" else ("read", "write", "admin")):
                    raise _HttpError(403, INTEGRATION_403 if who.get("login") is None
                                     else "Resource not accessible by personal access token")
                return

    # -- endpoints: identity and GitHub Apps

    def get_user(self, who: dict[str, Any]) -> dict[str, Any]:
        if who.get("login") is None:
            raise _HttpError(403, INTEGRATION_403)
        return {"login": who["login"], "id": abs(hash(who["login"])) % 10**8, "type": "User"}

    def create_installation_token(self, who: dict[str, Any], installation: str) -> dict[str, Any]:
        app = self.apps.get(who.get("app_id") or "")
        inst = app and app["installations"].get(str(installation))
        if not inst:
            raise _HttpError(404, "Not Found")
        self.minted += 1
        token = "ghs_inst_" + secrets.token_hex(18)
        expires = time.time() + inst["ttl_s"]
        self.tokens[token] = {"login": None, "scopes": None, "permissions": dict(inst["permissions"]),
                              "expires_at": expires}
        return {"token": token, "expires_at": datetime.fromtimestamp(int(expires), UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "permissions": dict(inst["permissions"]), "repository_selection": "all"}

    def admin_app(self, body: dict[str, Any]) -> dict[str, Any]:
        app = self.apps.setdefault(str(body["app_id"]), {"public_key": body["public_key"], "installations": {}})
        app["public_key"] = body["public_key"]
        app["installations"][str(body["installation_id"])] = {
            "permissions": {str(k): str(v) for k, v in (body.get("permissions") or {}).items()},
            "ttl_s": float(body.get("ttl_s", 3600))}
        return {"app_id": str(body["app_id"]), "installations": sorted(app["installations"])}

    def admin_token(self, body: dict[str, Any]) -> dict[str, Any]:
        self.tokens[body["token"]] = {"login": body["login"], "scopes": body.get("scopes"),
                                      "permissions": body.get("permissions"), "expires_at": None}
        return {"login": body["login"]}

    def admin_app_stats(self) -> dict[str, Any]:
        return {"minted": self.minted}

    def admin_expire_token(self, body: dict[str, Any]) -> dict[str, Any]:
        """End a token's life now, as GitHub does when its expiry passes (tests need no wall-clock wait)."""
        who = self.tokens.get(body["token"])
        if who is None:
            raise _HttpError(404, "Not Found")
        who["expires_at"] = time.time() - 1
        return {"expired": True}

    def rate_headers(self) -> dict[str, str]:
        b = self.budget
        return {"x-ratelimit-limit": str(b["limit"]), "x-ratelimit-remaining": str(max(0, b["limit"] - b["used"])),
                "x-ratelimit-used": str(b["used"]), "x-ratelimit-reset": str(b["reset"]),
                "x-ratelimit-resource": "core"}

    def count_request(self, not_modified: bool, conditional: bool) -> None:
        """Book one served API request: a 304 is free, everything else takes one from the budget."""
        with self.lock:
            self.stats["requests"] += 1
            self.stats["conditional"] += int(conditional)
            if not_modified:
                self.stats["not_modified"] += 1
            else:
                self.budget["used"] += 1

    def take_budget(self) -> None:
        """Start a new hourly window when the old one ended; refuse like GitHub when an enforced one is spent.
        (Error answers carry no X-RateLimit-* headers here unless they are this refusal.)"""
        with self.lock:
            b = self.budget
            if time.time() >= b["reset"]:
                b.update(used=0, reset=int(time.time()) + 3600)
            if b["enforce"] and b["used"] >= b["limit"]:
                raise _HttpError(403, "API rate limit exceeded for user ID 1.", headers=self.rate_headers())

    def admin_request_stats(self, body: dict[str, Any]) -> dict[str, Any]:
        out = {**self.stats, "counted": self.stats["requests"] - self.stats["not_modified"],
               "rate_remaining": max(0, self.budget["limit"] - self.budget["used"])}
        if body.get("reset"):
            self.stats = {k: 0 for k in self.stats}
        return out

    def admin_rate_budget(self, body: dict[str, Any]) -> dict[str, Any]:
        """Set the window: ``limit``, ``remaining`` and ``reset_in_s``; enforced from now on."""
        limit = int(body.get("limit", self.budget["limit"]))
        self.budget = {"limit": limit, "used": limit - int(body.get("remaining", limit)),
                       "reset": int(time.time() + float(body.get("reset_in_s", 3600))),
                       "enforce": bool(body.get("enforce", True))}
        return dict(self.budget)

    def take_rate_limit(self) -> None:
        if self.forced_limit["n"] <= 0:
            return
        self.forced_limit["n"] -= 1
        if self.forced_limit["status"] == 429:
            raise _HttpError(429, "You have exceeded a secondary rate limit. Please wait a few minutes "
                             "before you try again.", headers={"retry-after": "1"})
        raise _HttpError(403, "API rate limit exceeded for user ID 1.", headers={
            "x-ratelimit-limit": "5000", "x-ratelimit-remaining": "0", "x-ratelimit-used": "5000",
            "x-ratelimit-reset": str(int(time.time()) + 60), "x-ratelimit-resource": "core"})

    def route(self, method: str, path: str, q: dict[str, str], body: dict[str, Any],
              who: dict[str, Any] | None = None) -> tuple[int, Any, str | None]:
        """(status, payload, list_key): list_key None = object; "" = paged plain list; else paged under key."""
        r = r"/repos/(?P<repo>[^/]+/[^/]+)"
        who = who or self.tokens[self.token]
        routes: list[tuple[str, str, Any, int, str | None]] = [
            ("GET", r"/user", lambda m: self.get_user(who), 200, None),
            ("POST", r"/app/installations/(?P<id>\d+)/access_tokens",
             lambda m: self.create_installation_token(who, m["id"]), 201, None),
            ("POST", r"/_admin/app", lambda m: self.admin_app(body), 200, None),
            ("POST", r"/_admin/tokens", lambda m: self.admin_token(body), 200, None),
            ("POST", r"/_admin/app_stats", lambda m: self.admin_app_stats(), 200, None),
            ("POST", r"/_admin/expire_token", lambda m: self.admin_expire_token(body), 200, None),
            ("GET", r, lambda m: self.get_repo(m["repo"]), 200, None),
            ("GET", r + r"/issues/(?P<n>\d+)", lambda m: self.get_issue(m["repo"], m["n"]), 200, None),
            ("GET", r + r"/pulls", lambda m: self.list_pulls(m["repo"], q), 200, ""),
            ("POST", r + r"/pulls", lambda m: self.create_pull(m["repo"], body), 201, None),
            ("GET", r + r"/pulls/(?P<n>\d+)", lambda m: self._pull_json(m["repo"], self._pull(m["repo"], m["n"])),
             200, None),
            ("PATCH", r + r"/pulls/(?P<n>\d+)", lambda m: self.update_pull(m["repo"], m["n"], body, who), 200, None),
            ("PUT", r + r"/pulls/(?P<n>\d+)/merge", lambda m: self.merge_pull(m["repo"], m["n"], body, who),
             200, None),
            ("GET", r + r"/branches/(?P<b>[^/]+)", lambda m: self.get_branch(m["repo"], unquote(m["b"])), 200, None),
            ("GET", r + r"/activity", lambda m: self.list_activity(m["repo"], q), 200, ""),
            ("GET", r + r"/contents/(?P<path>.+)", lambda m: self.get_contents(m["repo"], unquote(m["path"]), q),
             200, None),
            ("DELETE", r + r"/git/refs/(?P<ref>(?:heads|tags)/.+)",
             lambda m: self.delete_ref(m["repo"], unquote(m["ref"]), who), 204, None),
            ("GET", r + r"/pulls/(?P<n>\d+)/reviews", lambda m: self.reviews(m["repo"], m["n"]), 200, ""),
            ("GET", r + r"/issues/(?P<n>\d+)/comments", lambda m: self.list_comments(m["repo"], m["n"]), 200, ""),
            ("POST", r + r"/issues/(?P<n>\d+)/comments", lambda m: self.add_comment(m["repo"], m["n"], body),
             201, None),
            ("PATCH", r + r"/issues/comments/(?P<id>\d+)",
             lambda m: self.update_comment(m["repo"], m["id"], body), 200, None),
            ("GET", r + r"/commits/(?P<ref>[^/]+)/check-runs", lambda m: self.check_runs(m["repo"], m["ref"]),
             200, "check_runs"),
            ("GET", r + r"/commits/(?P<ref>[^/]+)/status", lambda m: self.combined_status(m["repo"], m["ref"]),
             200, None),
            ("POST", r + r"/statuses/(?P<sha>[^/]+)", lambda m: self.create_status(m["repo"], m["sha"], body),
             201, None),
            ("GET", r + r"/branches/(?P<b>[^/]+)/protection/required_status_checks",
             lambda m: self.protection_required_checks(m["repo"], unquote(m["b"])), 200, None),
            ("GET", r + r"/rules/branches/(?P<b>[^/]+)", lambda m: self.branch_rules(m["repo"], unquote(m["b"])),
             200, ""),
            ("GET", r + r"/collaborators/(?P<u>[^/]+)/permission",
             lambda m: self.collaborator_permission(m["repo"], unquote(m["u"])), 200, None),
            ("GET", r"/orgs/(?P<org>[^/]+)/teams/(?P<slug>[^/]+)/memberships/(?P<u>[^/]+)",
             lambda m: self.team_membership(m["org"], m["slug"], unquote(m["u"])), 200, None),
            ("POST", r"/_admin/checks", lambda m: self.admin_set_check(body), 200, None),
            ("POST", r"/_admin/merge_gate", lambda m: self.admin_merge_gate(body), 200, None),
            ("POST", r"/_admin/comments", lambda m: self.admin_add_comment(body), 200, None),
            ("POST", r"/_admin/reviews", lambda m: self.admin_add_review(body), 200, None),
            ("POST", r"/_admin/rate_limit", lambda m: self.admin_rate_limit(body), 200, None),
            ("POST", r"/_admin/rate_budget", lambda m: self.admin_rate_budget(body), 200, None),
            ("POST", r"/_admin/request_stats", lambda m: self.admin_request_stats(body), 200, None),
            ("POST", r"/_admin/slow", lambda m: self.admin_slow(body), 200, None),
            ("POST", r"/_admin/permissions", lambda m: self.admin_permissions(body), 200, None),
            ("POST", r"/_admin/issues", lambda m: self.admin_issue(body), 200, None),
            ("POST", r"/_admin/webhook", lambda m: self.admin_webhook(body), 200, None),
            ("POST", r"/_admin/push", lambda m: self.admin_push(body), 200, None),
            ("POST", r"/_admin/served", lambda m: {"n": sum(
                n for k, n in (self.answered if body.get("answered") else self.served).items()
                if re.search(body["pattern"], k))}, 200, None),
            ("POST", r"/_admin/webhook_deliveries", lambda m: self.admin_webhook_deliveries(body), 200, None),
        ]
        if method == "POST" and path == "/_admin/webhook_redeliver":  # sends and waits: not under the lock
            return 200, self.admin_redeliver(body), None
        for verb, pattern, fn, status, list_key in routes:
            m = re.fullmatch(pattern, path)
            if m and verb == method:
                with self.lock:
                    return status, fn(m), list_key
        raise _HttpError(404, "Not Found")


def _login(who: dict[str, Any] | None) -> str:
    """Who GitHub names for an action: the token's owner, or an App installation's bot."""
    return (who or {}).get("login") or "gpu-rl-builder[bot]"


def _etag(authorization: str, data: bytes) -> str:
    return 'W/"' + hashlib.sha256(hashlib.sha256(authorization.encode()).digest() + data).hexdigest()[:40] + '"'


def _etag_matches(header: str, etag: str) -> bool:
    """RFC 9110 weak comparison: ``W/`` prefixes ignored; ``*`` matches any current representation."""
    def opaque(tag: str) -> str:
        tag = tag.strip()
        return tag[2:] if tag.startswith("W/") else tag

    return any(t.strip() == "*" or opaque(t) == opaque(etag) for t in header.split(","))


def _paginate(items: list[Any], q: dict[str, str], url: str) -> tuple[list[Any], str | None]:
    """Slice by ``per_page``/``page`` and build GitHub's ``Link`` header."""
    per_page = max(1, min(100, int(q.get("per_page", 30))))
    page = max(1, int(q.get("page", 1)))
    last = max(1, -(-len(items) // per_page))
    links = []
    if page < last:
        links.append(f'<{url}?{urlencode({**q, "page": page + 1, "per_page": per_page})}>; rel="next"')
        links.append(f'<{url}?{urlencode({**q, "page": last, "per_page": per_page})}>; rel="last"')
    return items[(page - 1) * per_page: page * per_page], ", ".join(links) or None


def _make_handler(app: GitHubStandin) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "GitHubStandin/1"
        disable_nagle_algorithm = True  # headers and body go out in two writes; avoid 40 ms stalls

        def log_message(self, format: str, *args: Any) -> None:  # quiet; no header ever logged
            pass

        def _send(self, status: int, payload: Any, headers: dict[str, str], *, data: bytes | None = None) -> None:
            if status == 204:  # No Content (e.g. a deleted ref): no body at all
                self.send_response(204)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                return
            if status == 304:  # no body, no Content-Length: the client keeps the one it has
                self.send_response(304)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                return
            data = json.dumps(payload).encode() if data is None else data
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("X-GitHub-Api-Version-Selected", "2022-11-28")
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def _handle(self) -> None:
            split = urlsplit(self.path)
            q = {k: v[-1] for k, v in parse_qs(split.query).items()}
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                try:
                    body = json.loads(raw) if raw else {}
                except ValueError:
                    raise _HttpError(400, "Problems parsing JSON") from None
                who = app.check_auth(self.headers.get("Authorization"), split.path)
                api = not split.path.startswith("/_admin/")
                if api:
                    with app.lock:
                        key = f"{self.command} {split.path}"
                        app.served[key] = app.served.get(key, 0) + 1
                if api:
                    app.take_budget()
                    app.take_rate_limit()
                    app.take_slow(self.command, split.path)  # after reading the request: it will be served
                    app.authorize(who, self.command, split.path)
                status, payload, list_key = app.route(self.command, split.path, q, body, who)
                if api:
                    with app.lock:
                        app.answered[key] = app.answered.get(key, 0) + 1
                headers = app.rate_headers()
                if who.get("scopes") is not None:  # a classic token: GitHub lists its scopes on every answer
                    headers["X-OAuth-Scopes"] = ", ".join(who["scopes"])
                if list_key is not None:
                    page, link = _paginate(payload, q, f"{app.base_url}{split.path}")
                    payload = {"total_count": len(payload), list_key: page} if list_key else page
                    if link:
                        headers["Link"] = link
                data = json.dumps(payload).encode()
                match = self.headers.get("If-None-Match")
                if api and self.command == "GET" and status == 200:
                    # GitHub's validators: a weak ETag over the answer as this token sees it (ETags differ
                    # per token); If-None-Match is compared weakly, a list or "*" allowed.
                    etag = _etag(self.headers.get("Authorization") or "", data)
                    headers["ETag"] = etag
                    if match is not None and _etag_matches(match, etag):
                        app.count_request(not_modified=True, conditional=True)
                        self._send(304, None, {**app.rate_headers(), "ETag": etag})
                        return
                if api:
                    app.count_request(not_modified=False, conditional=match is not None)
                    headers.update(app.rate_headers())
                self._send(status, payload, headers, data=data)
            except _HttpError as exc:
                if not split.path.startswith("/_admin/"):  # a refusal counts too (it is no 304)
                    app.count_request(not_modified=False, conditional=self.headers.get("If-None-Match") is not None)
                self._send(exc.status, exc.body(), exc.headers)
            except Exception as exc:  # a bug in the stand-in: say so, keep serving
                self._send(500, {"message": f"stand-in error: {type(exc).__name__}: {exc}"}, {})

        do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _handle

    return Handler


# ---------------------------------------------------------------- lifecycle


class GitHubStandinHandle:
    """A running stand-in: ``api_url``, ``token``, admin helpers, and an idempotent ``stop()``."""

    def __init__(self, api_url: str, token: str, stop_fn: Any, pid: int | None = None):
        self.api_url = api_url
        self.token = token
        self.pid = pid  # the subprocess (its own session/process group); None when in-thread
        self._stop_fn = stop_fn
        self._stopped = False
        atexit.register(self.stop)

    def __repr__(self) -> str:
        return f"GitHubStandinHandle(api_url={self.api_url!r})"

    def stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            self._stop_fn()

    def _admin(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        req = urllib.request.Request(
            f"{self.api_url}/_admin/{path}", data=json.dumps(payload).encode(), method="POST",
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"stand-in admin {path}: {exc.code} {exc.read().decode(errors='replace')}") from None

    def set_check(self, repo: str, sha: str, name: str, status: str = "completed",
                  conclusion: str | None = "success") -> dict[str, Any]:
        """Create or replace check run ``name`` on ``sha`` (a sha or branch name)."""
        return self._admin("checks", {"repo": repo, "sha": sha, "name": name, "status": status,
                                      "conclusion": conclusion})

    def push_as(self, repo: str, branch: str, sha: str, login: str) -> dict[str, Any]:
        """``login`` pushes ``sha`` (a commit already in the repo) to ``branch`` (forced if need be): the
        repository activity names them, and ``push``/``pull_request synchronize`` webhooks are sent."""
        return self._admin("push", {"repo": repo, "branch": branch, "sha": sha, "login": login})

    def add_review(self, repo: str, number: int, state: str = "APPROVED", user: str = "reviewer") -> dict[str, Any]:
        return self._admin("reviews", {"repo": repo, "number": number, "state": state, "user": user})

    def protect(self, repo: str, branch: str, contexts: list[str] | None) -> dict[str, Any]:
        """Branch protection on ``branch`` requiring ``contexts`` (None: protected, no status checks).
        Readable only when the token is admin (``set_permissions(repo, admin=True, ...)``)."""
        return self._admin("merge_gate", {"repo": repo, "branch": branch, "protection": {"contexts": contexts}})

    def add_ruleset(self, repo: str, branch: str, checks: list[str], enforcement: str = "active") -> dict[str, Any]:
        return self._admin("merge_gate", {"repo": repo, "ruleset": {"branches": [branch], "checks": checks,
                                                                     "enforcement": enforcement}})

    def set_collaborator(self, repo: str, login: str, permission: str) -> dict[str, Any]:
        """``permission``: admin, maintain, write, triage, read or none."""
        return self._admin("merge_gate", {"repo": repo, "collaborator": login, "permission": permission})

    def set_team(self, team: str, members: list[str]) -> dict[str, Any]:
        return self._admin("merge_gate", {"team": team, "members": members})

    def add_comment(self, repo: str, number: int, body: str, user: str) -> dict[str, Any]:
        return self._admin("comments", {"repo": repo, "number": number, "body": body, "user": user})

    def set_permissions(self, repo: str, **permissions: bool) -> dict[str, Any]:
        """What ``GET /repos/{repo}`` reports the token may do (default: push, triage, pull)."""
        return self._admin("permissions", {"repo": repo, "permissions": permissions})

    def set_issue(self, repo: str, number: int, *, locked: bool = False, missing: bool = False) -> dict[str, Any]:
        """Make issue ``number`` locked, or missing (404); every other number is an open issue."""
        return self._admin("issues", {"repo": repo, "number": number, "locked": locked, "missing": missing})

    def register_app(self, app_id: str, public_key_pem: str, installation_id: int, *,
                     permissions: dict[str, str], ttl_s: float = 3600) -> dict[str, Any]:
        """A GitHub App (verified by ``public_key_pem``) installed as ``installation_id`` with ``permissions``;
        its installation tokens expire after ``ttl_s``."""
        return self._admin("app", {"app_id": app_id, "public_key": public_key_pem, "installation_id": installation_id,
                                   "permissions": permissions, "ttl_s": ttl_s})

    def add_token(self, token: str, login: str, *, scopes: list[str] | None = None,
                  permissions: dict[str, str] | None = None) -> dict[str, Any]:
        """Accept ``token`` as ``login``'s: a classic token with ``scopes``, or fine-grained ``permissions``."""
        return self._admin("tokens", {"token": token, "login": login, "scopes": scopes, "permissions": permissions})

    def installation_tokens_minted(self) -> int:
        return int(self._admin("app_stats", {})["minted"])

    def expire_token(self, token: str) -> None:
        """``token`` is refused from now on (401 Bad credentials), as after its expiry at GitHub."""
        self._admin("expire_token", {"token": token})

    def rate_limit_next(self, n: int, status: int = 403) -> None:
        """Make the next ``n`` API requests fail with a primary (403) or secondary (429) rate limit."""
        self._admin("rate_limit", {"n": n, "status": status})

    def request_stats(self, *, reset: bool = False) -> dict[str, int]:
        """API requests served so far: ``requests``, ``not_modified`` (304: free on GitHub), ``counted``
        (the rest: what the primary rate limit is charged), ``conditional`` (sent with If-None-Match) and
        ``rate_remaining``; ``reset`` starts the counts again (not the rate-limit window)."""
        return {k: int(v) for k, v in self._admin("request_stats", {"reset": reset}).items()}

    def set_rate_budget(self, *, remaining: int, limit: int = 5000, reset_in_s: float = 3600,
                        enforce: bool = True) -> dict[str, Any]:
        """The primary rate-limit window every answer reports (and, ``enforce``, refuses with 403 at 0)."""
        return self._admin("rate_budget", {"limit": limit, "remaining": remaining, "reset_in_s": reset_in_s,
                                           "enforce": enforce})

    def served(self, pattern: str, *, answered: bool = False) -> int:
        """API requests whose ``"METHOD /path"`` matches the regex ``pattern``: received so far (counted before
        any ``slow_down``, so a test sees a slowed request arrive), or with ``answered`` those whose answer
        was already read from the state: a change made after that count moved is not in those answers."""
        return int(self._admin("served", {"pattern": pattern, "answered": answered})["n"])

    def api(self, method: str, path: str, payload: dict[str, Any] | None = None, *, token: str | None = None
            ) -> tuple[int, Any]:
        """Call the REST API as a person would (``token``: theirs, from ``add_token``): (status, JSON or None)."""
        req = urllib.request.Request(
            f"{self.api_url}{path}", data=json.dumps(payload).encode() if payload is not None else None,
            method=method, headers={"Authorization": f"Bearer {token or self.token}",
                                    "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                data = resp.read()
                return resp.status, json.loads(data) if data else None
        except urllib.error.HTTPError as exc:
            data = exc.read()
            return exc.code, json.loads(data) if data else None

    def set_webhook(self, url: str | None, secret: str = "") -> None:
        """Deliver webhooks to ``url`` signed with ``secret`` (None: stop), as a repository webhook does."""
        self._admin("webhook", {"url": url, "secret": secret})

    def webhook_deliveries(self) -> list[dict[str, Any]]:
        """Every delivery so far: id, event, status of the answer (None: not sent yet; 0: unreachable),
        attempts and the payload."""
        return self._admin("webhook_deliveries", {})  # type: ignore[return-value]

    def redeliver(self, delivery_id: str) -> int:
        """Send a delivery again with the same ``X-GitHub-Delivery``; the answer's status."""
        return int(self._admin("webhook_redeliver", {"id": delivery_id})["status"])

    def slow_down(self, method: str, path_regex: str, seconds: float) -> None:
        """Answer requests matching ``method`` and ``path_regex`` only after ``seconds`` (0: at once again).
        The request is still served: a client that dies meanwhile leaves its effect behind (a lost reply)."""
        self._admin("slow", {"method": method, "path": path_regex, "seconds": seconds})


def _serve(app: GitHubStandin) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(app))
    server.daemon_threads = True
    app.base_url = f"http://127.0.0.1:{server.server_address[1]}"
    return server


def start_github_standin(state_dir: Path, remotes: dict[str, str], *, auto_green: bool = False,
                         subprocess_mode: bool = False) -> GitHubStandinHandle:
    """Start the stand-in on 127.0.0.1:<free port>; ``remotes`` maps "owner/name" to a bare repo path."""
    token = "ghs_standin_" + secrets.token_hex(16)
    if subprocess_mode:
        return _start_subprocess(Path(state_dir), remotes, token, auto_green)
    app = GitHubStandin(Path(state_dir), remotes, token, auto_green=auto_green)
    server = _serve(app)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              name="github-standin", daemon=True)
    thread.start()

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)

    return GitHubStandinHandle(app.base_url, token, stop)


def _start_subprocess(state_dir: Path, remotes: dict[str, str], token: str, auto_green: bool) -> GitHubStandinHandle:
    root = Path(__file__).resolve().parent.parent
    argv = [sys.executable, "-m", "sandbox.github_standin", "--state-dir", str(state_dir)]
    for name, path in remotes.items():
        argv += ["--remote", f"{name}={path}"]
    if auto_green:
        argv.append("--auto-green")
    env = {**os.environ, TOKEN_ENV: token, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen(argv, cwd=root, env=env, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            start_new_session=True, text=True)

    def stop() -> None:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            except ProcessLookupError:
                pass
        if proc.stdout:
            proc.stdout.close()

    line = proc.stdout.readline() if proc.stdout else ""
    if not line.startswith("api_url="):
        stop()
        raise RuntimeError(f"github stand-in failed to start (exit {proc.poll()})")
    return GitHubStandinHandle(line.strip().split("=", 1)[1], token, stop, pid=proc.pid)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state-dir", required=True, type=Path)
    parser.add_argument("--remote", action="append", default=[], help="owner/name=/path/to/bare.git")
    parser.add_argument("--auto-green", action="store_true")
    args = parser.parse_args(argv)
    token = os.environ.get(TOKEN_ENV)
    if not token:
        parser.error(f"{TOKEN_ENV} must be set")
    remotes = dict(r.split("=", 1) for r in args.remote)
    server = _serve(GitHubStandin(args.state_dir, remotes, token, auto_green=args.auto_green))
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"api_url=http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()
    server.server_close()


if __name__ == "__main__":
    main()
