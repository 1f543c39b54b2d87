"""GitHub REST v3 client for the pin-update PR: open/update it, comment, read checks and reviews, merge.

Why its own small client: the workflow needs idempotent steps (``ensure_pull``, ``upsert_comment``)
and typed errors it can classify (retry a rate limit, stop on a moved head), and the token must never
leak into an error, repr or log line. Temporal-free; activities wrap it.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import hmac
import re
import secrets
from collections import OrderedDict
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ConfigDict

from clients import http_guard
from domain.credential_hosts import host_of
from domain.redact import redact  # PR and issue bodies are a sink too: the one redactor, as everywhere

API_VERSION = "2022-11-28"
# A REST reply is one page of at most 100 items (comments and check runs included): far below this cap.
MAX_REPLY_BYTES = 32 * 1024 * 1024
MARKER_PREFIX = "<!-- gpu-rl-builder:"
_REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]*/[A-Za-z0-9._-]+$")
_FAILED_CONCLUSIONS = {"failure", "cancelled", "timed_out", "action_required", "startup_failure", "stale"}


# ---------------------------------------------------------------- errors


class GitHubError(Exception):
    """Any GitHub API failure. Carries the HTTP status and GitHub's message, never the token."""

    def __init__(self, message: str, *, status: int | None = None, method: str = "", path: str = ""):
        self.status = status
        self.method = method
        self.path = path
        self.message = message
        where = f"{method} {path}".strip()
        super().__init__(f"{where}: {status} {message}" if status is not None else f"{where}: {message}")


class GitHubUnavailable(GitHubError):
    """Transport failure (connection refused, timeout): retryable, no HTTP status."""


class ValidationFailed(GitHubError):
    """422: the request was understood but refused; ``errors`` is GitHub's list of causes."""

    def __init__(self, message: str, *, errors: list[dict[str, Any]] | None = None, **kw: Any):
        self.errors = errors or []
        detail = "; ".join(str(e.get("message") or e.get("code") or e) for e in self.errors)
        super().__init__(f"{message} ({detail})" if detail else message, **kw)


class NotMergeable(GitHubError):
    """405 on merge: conflicts, failing required checks or branch protection."""


class HeadMoved(GitHubError):
    """409 on merge: the head branch no longer points at the sha we reviewed."""


class RateLimited(GitHubError):
    """403/429 rate limit. ``reset_at`` (primary limit) or ``retry_after`` (secondary) says when."""

    def __init__(self, message: str, *, reset_at: datetime | None, retry_after: float | None, **kw: Any):
        self.reset_at = reset_at
        self.retry_after = retry_after
        super().__init__(message, **kw)

    def wait_seconds(self, now: datetime | None = None) -> float:
        """How long to wait before retrying (at least 1 s)."""
        if self.retry_after is not None:
            return max(1.0, self.retry_after)
        if self.reset_at is not None:
            now = now or datetime.now(UTC)
            return max(1.0, (self.reset_at - now).total_seconds())
        return 60.0


class NotFound(GitHubError):
    """404: missing resource, or a private repo the token cannot see."""


class Unauthorized(GitHubError):
    """401: bad or expired token."""


class Forbidden(GitHubError):
    """403 that is not a rate limit: the token lacks a permission."""


# ---------------------------------------------------------------- models


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True)


class Pull(_Model):
    number: int
    state: Literal["open", "closed"]
    title: str
    body: str | None = None
    html_url: str | None = None
    head_ref: str
    head_sha: str
    base_ref: str
    base_sha: str | None = None
    merged: bool = False
    mergeable: bool | None = None  # None while GitHub is still computing it
    merge_commit_sha: str | None = None
    merged_by: str | None = None  # ``merged_by.login``: who merged it (GitHub names the person or the App's bot)
    closed_at: str | None = None

    @classmethod
    def from_api(cls, d: dict[str, Any]) -> Pull:
        return cls(
            number=d["number"],
            state=d["state"],
            title=d.get("title") or "",
            body=d.get("body"),
            html_url=d.get("html_url"),
            head_ref=d["head"]["ref"],
            head_sha=d["head"]["sha"],
            base_ref=d["base"]["ref"],
            base_sha=d["base"].get("sha"),
            merged=bool(d.get("merged") or d.get("merged_at")),
            mergeable=d.get("mergeable"),
            merge_commit_sha=d.get("merge_commit_sha"),
            merged_by=(d.get("merged_by") or {}).get("login"),
            closed_at=d.get("closed_at"),
        )


class Comment(_Model):
    id: int
    body: str
    html_url: str | None = None
    user_login: str | None = None

    @classmethod
    def from_api(cls, d: dict[str, Any]) -> Comment:
        return cls(
            id=d["id"], body=d.get("body") or "", html_url=d.get("html_url"),
            user_login=(d.get("user") or {}).get("login"),
        )


class CheckRun(_Model):
    id: int
    name: str
    head_sha: str
    status: str  # queued | in_progress | completed (| waiting, requested, pending)
    conclusion: str | None = None  # success | failure | neutral | cancelled | skipped | timed_out | ...
    html_url: str | None = None

    @classmethod
    def from_api(cls, d: dict[str, Any]) -> CheckRun:
        return cls(
            id=d["id"], name=d["name"], head_sha=d.get("head_sha", ""), status=d["status"],
            conclusion=d.get("conclusion"), html_url=d.get("html_url"),
        )


class CommitStatus(_Model):
    context: str
    state: str  # error | failure | pending | success
    description: str | None = None
    target_url: str | None = None


class CombinedStatus(_Model):
    state: str  # failure | pending | success
    sha: str
    total_count: int
    statuses: list[CommitStatus]

    @classmethod
    def from_api(cls, d: dict[str, Any]) -> CombinedStatus:
        statuses = [
            CommitStatus(
                context=s["context"], state=s["state"], description=s.get("description"),
                target_url=s.get("target_url"),
            )
            for s in d.get("statuses") or []
        ]
        return cls(state=d["state"], sha=d.get("sha", ""), total_count=d.get("total_count", len(statuses)),
                   statuses=statuses)


class Review(_Model):
    id: int
    state: str  # APPROVED | CHANGES_REQUESTED | COMMENTED | DISMISSED | PENDING
    user_login: str | None = None
    commit_id: str | None = None
    body: str | None = None

    @classmethod
    def from_api(cls, d: dict[str, Any]) -> Review:
        return cls(
            id=d["id"], state=d["state"], user_login=(d.get("user") or {}).get("login"),
            commit_id=d.get("commit_id"), body=d.get("body"),
        )


class MergeResult(_Model):
    sha: str
    merged: bool
    message: str


class Push(_Model):
    """One entry of GitHub's repository activity (``GET /repos/{o}/{r}/activity``): who moved a ref, when."""

    before: str
    after: str
    ref: str
    timestamp: str
    activity_type: str  # push, force_push, branch_creation, branch_deletion, pr_merge, merge_queue_merge
    actor: str | None = None

    @classmethod
    def from_api(cls, d: dict[str, Any]) -> Push:
        return cls(before=d.get("before") or "", after=d.get("after") or "", ref=d.get("ref") or "",
                   timestamp=d.get("timestamp") or "", activity_type=d.get("activity_type") or "",
                   actor=(d.get("actor") or {}).get("login"))


class RateLimitInfo(_Model):
    """GitHub's ``X-RateLimit-*`` headers of the latest answer (any status, 304 included)."""

    limit: int | None = None
    remaining: int | None = None
    reset_at: datetime | None = None
    resource: str | None = None

    @classmethod
    def from_headers(cls, headers: httpx.Headers) -> RateLimitInfo | None:
        def num(name: str) -> int | None:
            value = headers.get(name)
            return int(value) if value and value.isdigit() else None

        limit, remaining, reset = num("x-ratelimit-limit"), num("x-ratelimit-remaining"), num("x-ratelimit-reset")
        if limit is None and remaining is None:
            return None
        return cls(limit=limit, remaining=remaining, resource=headers.get("x-ratelimit-resource"),
                   reset_at=datetime.fromtimestamp(reset, UTC) if reset is not None else None)


# ---------------------------------------------------------------- helpers


def checks_state(
    check_runs: Iterable[CheckRun],
    combined: CombinedStatus,
    *,
    required: Iterable[str] | None = None,
) -> Literal["pending", "success", "failure"]:
    """Fold check runs and commit statuses into one verdict.

    Any failed check or status is ``failure``; anything unfinished, or nothing reported at all (or a
    ``required`` name not reported yet), is ``pending``: absence of CI is never success.
    """
    runs = list(check_runs)
    if any(r.status == "completed" and r.conclusion in _FAILED_CONCLUSIONS for r in runs):
        return "failure"
    if any(s.state in ("failure", "error") for s in combined.statuses) or combined.state in ("failure", "error"):
        return "failure"
    if not runs and combined.total_count == 0:
        return "pending"
    if any(r.status != "completed" for r in runs) or any(s.state == "pending" for s in combined.statuses):
        return "pending"
    if required is not None:
        seen = {r.name for r in runs} | {s.context for s in combined.statuses}
        if not set(required) <= seen:
            return "pending"
    return "success"


def comment_marker(key: str) -> str:
    """The hidden HTML marker that lets ``upsert_comment`` find its own comment again."""
    return f"{MARKER_PREFIX}{key} -->"


def _next_link(link_header: str | None) -> str | None:
    for part in (link_header or "").split(","):
        m = re.match(r'\s*<([^>]+)>\s*;\s*rel="next"', part)
        if m:
            return m.group(1)
    return None


# ---------------------------------------------------------------- conditional requests


@dataclass
class _Cached:
    etag: str | None
    last_modified: str | None
    content: bytes
    headers: dict[str, str]  # only _KEPT_HEADERS: never Authorization, cookies or scopes


_KEPT_HEADERS = ("content-type", "link", "etag", "last-modified")


class ConditionalCache:
    """ETag / Last-Modified validators and bodies of GET answers, in memory, for conditional requests.

    Why: the PR watch re-reads the same few resources every few seconds and on an idle PR they are the
    same bytes every time. GitHub answers ``If-None-Match`` (or ``If-Modified-Since``) with ``304 Not
    Modified`` when nothing changed, and a 304 to an authorized request does not count against the primary
    rate limit ("Best practices for using the REST API": use conditional requests if appropriate); the
    client then hands back the body it already has.

    One per worker process (an activity group holds it, so consecutive watches share it; a restart starts
    cold). Keyed by scheme, host, port, path, sorted query and a fingerprint of the token (an HMAC with a
    per-cache random key: the token itself is never stored, and a fingerprint seen in a dump tells nothing
    without the key). Answers are never shared between tokens or hosts: GitHub's ETags differ per token
    anyway, and one token's view must never be served to another. Bounded by entries and bytes (LRU).
    """

    def __init__(self, max_entries: int = 512, max_bytes: int = 16 * 1024 * 1024):
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._key = secrets.token_bytes(32)
        self._entries: OrderedDict[tuple[str, str], _Cached] = OrderedDict()
        self._bytes = 0

    def __repr__(self) -> str:
        return f"ConditionalCache(entries={len(self._entries)}, bytes={self._bytes})"

    def __len__(self) -> int:
        return len(self._entries)

    def key(self, url: httpx.URL, token: str) -> tuple[str, str]:
        query = "&".join(f"{k}={v}" for k, v in sorted(url.params.multi_items()))
        where = f"{url.scheme}://{url.host}:{url.port or ''}{url.path}?{query}"
        return where, hmac.new(self._key, token.encode(), hashlib.sha256).hexdigest()[:32]

    def get(self, key: tuple[str, str]) -> _Cached | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, key: tuple[str, str], resp: httpx.Response) -> None:
        etag, modified = resp.headers.get("etag"), resp.headers.get("last-modified")
        self.drop(key)
        if not (etag or modified) or len(resp.content) > self.max_bytes // 4:
            return
        headers = {k: resp.headers[k] for k in _KEPT_HEADERS if k in resp.headers}
        self._entries[key] = _Cached(etag, modified, resp.content, headers)
        self._bytes += len(resp.content)
        while self._entries and (len(self._entries) > self.max_entries or self._bytes > self.max_bytes):
            _, old = self._entries.popitem(last=False)
            self._bytes -= len(old.content)

    def drop(self, key: tuple[str, str]) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= len(old.content)


class _Pinned(httpx.Auth):
    """``Authorization: Bearer`` with one token already chosen (the one a conditional GET is keyed by)."""

    def __init__(self, token: str):
        self._token = token

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers["Authorization"] = f"Bearer {self._token}"
        yield request


# ---------------------------------------------------------------- client


class _Bearer(httpx.Auth):
    """``Authorization: Bearer`` from a fixed token or a provider asked before every request (an App
    installation token that is minted again near its expiry)."""

    def __init__(self, token: str | Callable[[], str]):
        self._token = token
        self.seen: set[str] = set()  # every value sent, for scrubbing errors

    def current(self) -> str:
        value = self._token() if callable(self._token) else self._token
        self.seen.add(value)
        return value

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers["Authorization"] = f"Bearer {self.current()}"
        yield request


class GitHubClient:
    """Async REST v3 client bound to one repository. Use as ``async with GitHubClient(...) as gh``.

    ``token``: a token, or a callable returning the current one (clients/github_app.py). ``cache``: send
    every GET as a conditional request and reuse the cached body on 304 (``ConditionalCache``).

    ``rate`` is the latest ``X-RateLimit-*`` reading; ``requests`` / ``not_modified`` count the answers
    received (a 304 does not count against the primary rate limit; every other answer does)."""

    def __init__(self, api_url: str, token: str | Callable[[], str], repo: str,
                 transport: httpx.AsyncBaseTransport | None = None, *, timeout: float = 30.0,
                 cache: ConditionalCache | None = None):
        if not _REPO_RE.match(repo):
            raise ValueError(f"repo must be 'owner/name', got {repo!r}")
        self.api_url = api_url.rstrip("/")
        self.repo = repo
        self.owner = repo.split("/", 1)[0]
        self._auth = _Bearer(token)
        self._cache = cache
        self.rate: RateLimitInfo | None = None
        self.requests = 0
        self.not_modified = 0
        # The token goes to github.api_url's host only (over TLS unless loopback); replies stop at the cap.
        self._http = http_guard.async_client(
            allowed_hosts=(host_of(self.api_url),), credential="github.token", max_body_bytes=MAX_REPLY_BYTES,
            base_url=self.api_url,
            transport=transport,
            timeout=timeout,
            auth=self._auth,
            headers={
                "Accept": "application/vnd.github+json",
                "X-GitHub-Api-Version": API_VERSION,
                "User-Agent": "gpu-rl-builder",
            },
        )

    def __repr__(self) -> str:
        return f"GitHubClient(api_url={self.api_url!r}, repo={self.repo!r})"

    def for_repo(self, repo: str) -> GitHubClient:
        """The same connection and token bound to another repository (a cross-repo issue comment).

        The returned client borrows this one's connection: close this one, not it."""
        if not _REPO_RE.match(repo):
            raise ValueError(f"repo must be 'owner/name', got {repo!r}")
        other = copy.copy(self)
        other.repo, other.owner = repo, repo.split("/", 1)[0]
        return other

    @property
    def counted(self) -> int:
        """Answers that count against the primary rate limit (every one but a 304)."""
        return self.requests - self.not_modified

    async def __aenter__(self) -> GitHubClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # -- transport and error mapping

    def _scrub(self, text: str) -> str:
        for token in self._auth.seen:
            if token:
                text = text.replace(token, "***")
        return text

    async def _request(self, method: str, path: str, *, json: Any = None, params: dict[str, Any] | None = None,
                       conflict: type[GitHubError] = GitHubError) -> httpx.Response:
        target = httpx.URL(path)
        if target.is_absolute_url and (target.scheme, target.host, target.port) != (
                self._http.base_url.scheme, self._http.base_url.host, self._http.base_url.port):
            # The token is bound to github.api_url: a link in a response (``Link: rel="next"``) naming
            # another host is refused, never followed with the Authorization header.
            raise GitHubError(f"refusing to send the GitHub token to {target.host} (github.api_url is "
                              f"{self._http.base_url.host})", method=method, path=str(target.copy_with(query=None)))
        key: tuple[str, str] | None = None
        cached: _Cached | None = None
        try:
            if self._cache is not None and method == "GET":
                # The token is chosen first: the answer is keyed by it and sent with exactly it.
                token = self._auth.current()
                request = self._http.build_request(method, path, params=params)
                key = self._cache.key(request.url, token)
                cached = self._cache.get(key)
                if cached is not None and cached.etag:
                    request.headers["If-None-Match"] = cached.etag
                elif cached is not None and cached.last_modified:
                    request.headers["If-Modified-Since"] = cached.last_modified
                resp = await self._http.send(request, auth=_Pinned(token))
            else:
                resp = await self._http.request(method, path, json=json, params=params)
        except GitHubError:  # the token provider could not mint a token (github.app)
            raise
        except (http_guard.ResponseTooLarge, http_guard.CredentialRefused) as exc:  # not transient
            raise GitHubError(self._scrub(str(exc)), method=method, path=path) from None
        except httpx.HTTPError as exc:
            # Raised "from None": the httpx exception carries the request, whose headers hold the token.
            raise GitHubUnavailable(self._scrub(f"{type(exc).__name__}: {exc}"), method=method,
                                    path=path) from None
        self.requests += 1
        self.rate = RateLimitInfo.from_headers(resp.headers) or self.rate
        if resp.status_code == 304 and cached is not None:
            self.not_modified += 1
            headers = {**cached.headers, **{k: v for k, v in resp.headers.items()
                                            if k.lower().startswith("x-ratelimit-") or k.lower() == "etag"}}
            return httpx.Response(200, headers=headers, content=cached.content, request=resp.request)
        if key is not None and self._cache is not None:
            if resp.is_success:
                self._cache.put(key, resp)
            else:
                self._cache.drop(key)
        if resp.is_success:
            return resp
        raise self._error(resp, method, path, conflict)

    def _error(self, resp: httpx.Response, method: str, path: str, conflict: type[GitHubError]) -> GitHubError:
        try:
            data = resp.json()
        except ValueError:
            data = {}
        if not isinstance(data, dict):
            data = {}
        message = self._scrub(str(data.get("message") or resp.reason_phrase or "error"))
        status = resp.status_code
        kw: dict[str, Any] = {"status": status, "method": method, "path": path}
        headers = resp.headers
        if status in (403, 429) and (
            headers.get("x-ratelimit-remaining") == "0" or "retry-after" in headers or status == 429
        ):
            reset = headers.get("x-ratelimit-reset")
            retry = headers.get("retry-after")
            return RateLimited(
                message,
                reset_at=datetime.fromtimestamp(int(reset), UTC) if reset and reset.isdigit() else None,
                retry_after=float(retry) if retry and retry.replace(".", "", 1).isdigit() else None,
                **kw,
            )
        match status:
            case 401:
                return Unauthorized(message, **kw)
            case 403:
                return Forbidden(message, **kw)
            case 404:
                return NotFound(message, **kw)
            case 405:
                return NotMergeable(message, **kw)
            case 409:
                return conflict(message, **kw)
            case 422:
                errors = data.get("errors") if isinstance(data.get("errors"), list) else []
                clean = [{k: self._scrub(str(v)) for k, v in e.items()} if isinstance(e, dict)
                         else {"message": self._scrub(str(e))} for e in errors]
                return ValidationFailed(message, errors=clean, **kw)
            case _:
                return GitHubError(message, **kw)

    async def _json(self, method: str, path: str, **kw: Any) -> Any:
        return (await self._request(method, path, **kw)).json()

    async def _paged(self, path: str, params: dict[str, Any] | None = None, *, key: str | None = None,
                     ) -> list[dict[str, Any]]:
        """GET every page, following ``Link: rel="next"``; ``key`` picks the list out of an object."""
        items: list[dict[str, Any]] = []
        url: str | None = path
        query: dict[str, Any] | None = {"per_page": 100, **(params or {})}
        while url:
            resp = await self._request("GET", url, params=query)
            data = resp.json()
            items.extend(data[key] if key else data)
            url, query = _next_link(resp.headers.get("link")), None
        return items

    @property
    def _r(self) -> str:
        return f"/repos/{self.repo}"

    # -- pulls

    async def find_pull(self, head_branch: str, base: str) -> Pull | None:
        """The PR from ``head_branch`` into ``base``: the open one if any, else the newest closed one."""
        pulls = [Pull.from_api(d) for d in await self._paged(
            f"{self._r}/pulls", {"head": f"{self.owner}:{head_branch}", "base": base, "state": "all"})]
        pulls = [p for p in pulls if p.head_ref == head_branch and p.base_ref == base]
        if not pulls:
            return None
        open_pulls = [p for p in pulls if p.state == "open"]
        return max(open_pulls or pulls, key=lambda p: p.number)

    async def create_pull(self, head: str, base: str, title: str, body: str) -> Pull:
        return Pull.from_api(await self._json(
            "POST", f"{self._r}/pulls", json={"head": head, "base": base, "title": redact(title), "body": redact(body)}))

    async def close_pull(self, number: int) -> Pull:
        """Close the PR unmerged (a closed one stays as it is)."""
        return Pull.from_api(await self._json("PATCH", f"{self._r}/pulls/{number}", json={"state": "closed"}))

    async def update_pull(self, number: int, title: str | None = None, body: str | None = None) -> Pull:
        patch = {k: redact(v) for k, v in {"title": title, "body": body}.items() if v is not None}
        return Pull.from_api(await self._json("PATCH", f"{self._r}/pulls/{number}", json=patch))

    async def get_pull(self, number: int) -> Pull:
        return Pull.from_api(await self._json("GET", f"{self._r}/pulls/{number}"))

    async def ensure_pull(self, head: str, base: str, title: str, body: str) -> Pull:
        """Find-or-create the PR, then bring title/body up to date. Safe to repeat.

        An already merged PR is returned as is (a retried step after the merge must not open a second
        PR); a closed unmerged one is left alone and a new PR is opened.
        """
        pull = await self.find_pull(head, base)
        if pull is not None and (pull.state == "open" or pull.merged):
            if pull.state == "open" and (pull.title != title or (pull.body or "") != body):
                pull = await self.update_pull(pull.number, title=title, body=body)
            return pull
        try:
            return await self.create_pull(head, base, title, body)
        except ValidationFailed as exc:
            # Lost a race with another attempt that created it between our find and create.
            if not any("already exists" in str(e.get("message", "")) for e in exc.errors):
                raise
            pull = await self.find_pull(head, base)
            if pull is None:
                raise
            return await self.update_pull(pull.number, title=title, body=body)

    async def merge_pull(self, number: int, sha: str, method: str = "merge") -> MergeResult:
        """Merge only if the head is still ``sha`` (409 → HeadMoved; 405 → NotMergeable)."""
        data = await self._json("PUT", f"{self._r}/pulls/{number}/merge",
                                json={"sha": sha, "merge_method": method}, conflict=HeadMoved)
        return MergeResult(sha=data["sha"], merged=bool(data.get("merged")), message=data.get("message", ""))

    async def reviews(self, pull_number: int) -> list[Review]:
        return [Review.from_api(d) for d in await self._paged(f"{self._r}/pulls/{pull_number}/reviews")]

    # -- merge gate: required checks, reviewers' access, operators' teams

    async def protection_required_checks(self, branch: str) -> list[str]:
        """``GET /repos/{o}/{r}/branches/{b}/protection/required_status_checks``: the required contexts.

        An unprotected branch (404 "Branch not protected") or one without status-check protection (404
        "Required status checks not enabled") requires none: ``[]``. Other errors propagate (403 when
        the token lacks administration read, 404 "Not Found" when it cannot see the settings at all)."""
        try:
            data = await self._json("GET", f"{self._r}/branches/{quote(branch, safe='')}/protection/"
                                           "required_status_checks")
        except NotFound as e:
            if e.message in ("Branch not protected", "Required status checks not enabled"):
                return []
            raise
        names = set(data.get("contexts") or []) | {c["context"] for c in data.get("checks") or [] if c.get("context")}
        return sorted(names)

    async def ruleset_required_checks(self, branch: str) -> list[str]:
        """``GET /repos/{o}/{r}/rules/branches/{b}``: contexts of every active ``required_status_checks`` rule
        (readable with read access; rulesets apply on top of branch protection)."""
        rules = await self._paged(f"{self._r}/rules/branches/{quote(branch, safe='')}")
        names: set[str] = set()
        for rule in rules:
            if rule.get("type") == "required_status_checks":
                params = rule.get("parameters") or {}
                names |= {c["context"] for c in params.get("required_status_checks") or [] if c.get("context")}
        return sorted(names)

    async def collaborator_permission(self, login: str) -> str:
        """``GET /repos/{o}/{r}/collaborators/{u}/permission``: admin, write, read or none (maintain → write)."""
        data = await self._json("GET", f"{self._r}/collaborators/{quote(login, safe='')}/permission")
        return str(data.get("permission") or "none")

    async def team_membership(self, team: str, login: str) -> str | None:
        """``GET /orgs/{org}/teams/{slug}/memberships/{u}``: "active"/"pending", or None when not a member."""
        org, slug = team.split("/", 1)
        try:
            data = await self._json("GET", f"/orgs/{quote(org, safe='')}/teams/{quote(slug, safe='')}/memberships/"
                                           f"{quote(login, safe='')}")
        except NotFound:
            return None
        return str(data.get("state") or "")

    # -- access (preflight)

    async def repo_permissions(self) -> dict[str, bool]:
        """What the token may do on the repository (``GET /repos/{o}/{r}`` → ``permissions``)."""
        data = await self._json("GET", self._r)
        perms = data.get("permissions") if isinstance(data, dict) else None
        return {k: bool(v) for k, v in (perms or {}).items()}

    async def issue(self, number: int) -> dict[str, Any]:
        """``GET /repos/{o}/{r}/issues/{n}``: number, state and ``locked`` (a locked issue takes comments
        only from collaborators with push access), and ``closed_by`` (a PR is an issue too: GitHub names
        who closed it only here, not on the pull object)."""
        data = await self._json("GET", f"{self._r}/issues/{number}")
        return {"number": data.get("number"), "state": data.get("state"), "locked": bool(data.get("locked")),
                "closed_by": (data.get("closed_by") or {}).get("login")}

    async def branch_exists(self, branch: str) -> bool:
        """``GET /repos/{o}/{r}/branches/{branch}``: 200 it exists, 404 ("Branch not found") it does not."""
        try:
            await self._json("GET", f"{self._r}/branches/{quote(branch, safe='')}")
        except NotFound:
            return False
        return True

    async def ref_activity(self, branch: str, *, per_page: int = 30) -> list[Push]:
        """Who pushed to ``branch`` and when, newest first (repository activity; one page: the latest)."""
        data = await self._json("GET", f"{self._r}/activity",
                                params={"ref": f"refs/heads/{branch}", "per_page": per_page, "direction": "desc"})
        return [Push.from_api(d) for d in data if isinstance(d, dict)]

    async def file_text(self, path: str, ref: str) -> str | None:
        """``path`` as committed at ``ref`` (``GET /contents/{path}?ref=``), or None when it is not there."""
        try:
            data = await self._json("GET", f"{self._r}/contents/{quote(path)}", params={"ref": ref})
        except NotFound:
            return None
        if not isinstance(data, dict) or data.get("type") != "file" or data.get("encoding") != "base64":
            raise GitHubError(f"{path} at {ref}: not a file GitHub returned in base64", method="GET",
                              path=f"{self._r}/contents/{path}")
        return base64.b64decode(data.get("content") or "").decode("utf-8", errors="replace")

    # -- issue comments

    async def comment_issue(self, issue_number: int, body: str) -> Comment:
        return Comment.from_api(await self._json(
            "POST", f"{self._r}/issues/{issue_number}/comments", json={"body": redact(body)}))

    async def list_issue_comments(self, n: int) -> list[Comment]:
        return [Comment.from_api(d) for d in await self._paged(f"{self._r}/issues/{n}/comments")]

    async def update_comment(self, id: int, body: str) -> Comment:
        return Comment.from_api(await self._json("PATCH", f"{self._r}/issues/comments/{id}",
                                                 json={"body": redact(body)}))

    async def upsert_comment(self, issue_number: int, marker: str, body: str) -> Comment:
        """Edit the comment carrying ``marker`` (e.g. ``comment_marker("build-report")``) or post it once.

        The marker is appended to ``body`` when missing so the next call finds it again.
        """
        if not marker.startswith(MARKER_PREFIX):
            marker = comment_marker(marker)
        if marker not in body:
            body = f"{body}\n\n{marker}"
        for c in await self.list_issue_comments(issue_number):
            if marker in c.body:
                return c if c.body == body else await self.update_comment(c.id, body)
        return await self.comment_issue(issue_number, body)

    # -- checks

    async def check_runs(self, ref: str) -> list[CheckRun]:
        return [CheckRun.from_api(d) for d in await self._paged(
            f"{self._r}/commits/{ref}/check-runs", key="check_runs")]

    async def combined_status(self, ref: str) -> CombinedStatus:
        return CombinedStatus.from_api(await self._json(
            "GET", f"{self._r}/commits/{ref}/status", params={"per_page": 100}))
