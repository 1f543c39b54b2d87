"""The merge gate's GitHub side: required checks, blocking reviews, operators, the caller's identity.

Why its own module: the PR watch, the merge and the operator check all need the same answers (is this
login a configured operator? may this reviewer block? which checks does the base branch require?),
read from GitHub's API and decided by ``domain.merge_gate``; the activities in ``record.py`` and
``OperatorActivities`` below only call them. Nothing here trusts a name the caller typed: a login is an
operator only when the worker's configuration lists it or GitHub says it is an active member of a
configured team.
"""

from __future__ import annotations

import time
from urllib.parse import urlsplit, urlunsplit

from temporalio import activity

from activities.common import ActivityGroup
from activities.errors import NotAuthorized
from clients.github import _FAILED_CONCLUSIONS, CheckRun, GitHubClient, GitHubError, Pull, comment_marker
from clients.identity import github_auth
from domain.config import OperatorSettings, ServiceConfig
from domain.merge_gate import (
    RequiredChecks,
    fold,
    is_approve_command,
    required_set,
    standing,
    verdict,
)
from domain.models import (
    AuthorizeInput,
    ForeignHead,
    GitHubApproval,
    MergedPins,
    PinnedImage,
    ReviewState,
    VerifiedOperator,
)
from domain.outcome import restore_head_command
from domain.pins import read_pins
from domain.render import inert_markdown

REQUIRED_TTL_S = 300.0  # branch protection and rulesets change rarely: re-read every 5 minutes of a watch


def github_client(config: ServiceConfig) -> GitHubClient | None:
    gh = config.github
    if gh is None:
        return None
    return GitHubClient(gh.api_url, github_auth(gh), config.repos.marinskyrl_slug)  # token or GitHub App


def _run_state(r: CheckRun) -> str:
    if r.status != "completed":
        return "pending"
    return "failure" if r.conclusion in _FAILED_CONCLUSIONS else "success"


def gate_reader(gh: GitHubClient, config: ServiceConfig) -> GateReader:
    return GateReader(gh, config.operators, config.github.required_checks if config.github else [],
                      repo_url=_public_url(config.repos.marinskyrl_url),
                      pin_table_path=config.github.pin_table_path if config.github else "")


def _public_url(url: str) -> str:
    """The clone URL without any user or password in it (it is printed in a restore command)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def _transient(e: GitHubError) -> bool:
    return e.status is None or e.status >= 500 or e.status == 429


class GateReader:
    """One activity's view of the gate. Caches what changes rarely for the activity's life: the required
    checks (``REQUIRED_TTL_S``), each reviewer's access and each login's operator standing."""

    def __init__(self, gh: GitHubClient, operators: OperatorSettings, configured_required: list[str], *,
                 repo_url: str = "", pin_table_path: str = ""):
        self.gh = gh
        self.operators = operators
        self.configured_required = list(configured_required)
        self.repo_url = repo_url
        self.pin_table_path = pin_table_path
        self._required: tuple[float, str, RequiredChecks] | None = None
        self._write: dict[str, bool] = {}
        self._operator: dict[str, str | None] = {}
        self._foreign: dict[str, ForeignHead] = {}  # head sha -> who pushed it (once GitHub named them)

    async def required(self, base: str) -> RequiredChecks:
        now = time.monotonic()
        if self._required and self._required[1] == base and now - self._required[0] < REQUIRED_TTL_S:
            return self._required[2]
        notes = []
        try:
            protection: list[str] | None = await self.gh.protection_required_checks(base)
        except GitHubError as e:
            if e.status is None or e.status >= 500 or e.status == 429:
                raise  # transient: the boundary retries
            protection = None
            notes.append(f"branch protection of {base} unreadable ({e.status} {e.message}: the token needs "
                         "administration read)")
        try:
            rulesets: list[str] | None = await self.gh.ruleset_required_checks(base)
        except GitHubError as e:
            if e.status is None or e.status >= 500 or e.status == 429:
                raise
            rulesets = None
            notes.append(f"rulesets of {base} unreadable ({e.status} {e.message})")
        req = required_set(protection, rulesets, self.configured_required, unreadable="; ".join(notes))
        self._required = (now, base, req)
        return req

    async def can_write(self, login: str) -> bool:
        """May ``login`` block a merge? Only with write access; an unreadable answer counts as yes (safe)."""
        key = login.lower()
        if key not in self._write:
            try:
                self._write[key] = await self.gh.collaborator_permission(login) in ("admin", "write")
            except GitHubError as e:
                if e.status is None or e.status >= 500 or e.status == 429:
                    raise
                activity.logger.warning(f"access of reviewer {login} unreadable ({e}); their review blocks")
                self._write[key] = True
        return self._write[key]

    async def operator(self, login: str) -> str | None:
        key = login.lower()
        if key not in self._operator:
            self._operator[key] = await verify_operator(self.gh, self.operators, login, strict=False)
        return self._operator[key]

    async def foreign_head(self, pull: Pull, pin: str) -> ForeignHead:
        """The PR's head is not ``pin``: who pushed it and when (GitHub's repository activity of the branch),
        and the command that puts the pin commit back (with a lease on exactly this head)."""
        if pull.head_sha in self._foreign:
            return self._foreign[pull.head_sha]
        push = None
        try:
            push = next((p for p in await self.gh.ref_activity(pull.head_ref) if p.after == pull.head_sha), None)
        except GitHubError as e:
            if _transient(e):
                raise
            activity.logger.warning(f"who pushed {pull.head_sha[:12]} to {pull.head_ref} is unreadable: {e}")
        head = ForeignHead(
            sha=pull.head_sha, pin_commit=pin, branch=pull.head_ref, pushed_by=push.actor if push else None,
            pushed_at=push.timestamp if push else None, how=push.activity_type if push else "",
            restore_command=restore_head_command(self.repo_url, pull.head_ref, pin, pull.head_sha)
            if self.repo_url else "")
        if push is not None:
            self._foreign[pull.head_sha] = head
        return head

    async def merged_pins(self, commit: str, images: list[PinnedImage]) -> MergedPins:
        """What the pin table of ``commit`` (a merge commit) holds for each validated image, read from GitHub:
        a report never says the merged table holds the validated digests without reading it."""
        path = self.pin_table_path
        try:
            text = await self.gh.file_text(path, commit)
        except GitHubError as e:
            if _transient(e):
                raise
            return MergedPins(path=path, commit=commit, holds_validated=False, unreadable=f"{e.status} {e.message}")
        if text is None:
            return MergedPins(path=path, commit=commit, holds_validated=False,
                              unreadable=f"{path} not found at {commit[:12]}")
        pins = read_pins(text)
        differences = []
        for img in images:
            arch, _, variant = img.key.partition("-")
            got = pins.get((arch.upper(), variant.upper()), {}).get("digest")
            if got != img.digest:
                differences.append(f"{img.key} pins {got or 'nothing'}, not the validated {img.digest}")
        return MergedPins(path=path, commit=commit, holds_validated=not differences, differences=differences)

    async def state(self, number: int, overrides: list[str] | None = None, *, pin: str | None = None,
                    images: list[PinnedImage] | None = None) -> ReviewState:
        """The gate as GitHub shows it. With ``pin`` (the commit the service pushed): a head that is not it
        is reported with who pushed it; with ``images``: a merged PR's pin table is read and compared."""
        gh = self.gh
        pull = await gh.get_pull(number)
        runs = await gh.check_runs(pull.head_sha)
        combined = await gh.combined_status(pull.head_sha)
        status_state = {"success": "success", "pending": "pending"}
        reported = fold([(r.name, _run_state(r)) for r in runs]
                        + [(s.context, status_state.get(s.state, "failure")) for s in combined.statuses])
        required = await self.required(pull.base_ref)
        v = verdict(reported, required, overrides or [])
        latest = standing((r.user_login or "", r.state, r.commit_id) for r in await gh.reviews(number))
        requested = [login for login, st, _ in latest.values() if st == "CHANGES_REQUESTED"]
        blocking = [login for login in requested if await self.can_write(login)]
        approval = None
        if not pull.merged and pull.state == "open":
            approval = await self._github_approval(number, pull.head_sha, latest)
        closed_by, branch_deleted = None, False
        if not pull.merged:
            # Someone else may have ended the wait: deleting the head branch closes the PR on GitHub (so a
            # missing branch is asked about only once it is closed), and only the issue names who closed it.
            if pull.state == "closed":
                closed_by = (await gh.issue(number)).get("closed_by")
                branch_deleted = not await gh.branch_exists(pull.head_ref)
        foreign = None
        if pin and pull.head_sha != pin and (pull.state == "open" or pull.merged):
            foreign = await self.foreign_head(pull, pin)
        merged_pins = None
        if pull.merged and images and pull.merge_commit_sha and self.pin_table_path:
            merged_pins = await self.merged_pins(pull.merge_commit_sha, images)
        return ReviewState(
            foreign_head=foreign, merged_pins=merged_pins,
            mergeable=pull.mergeable if pull.state == "open" and not pull.merged else None,
            # Main's head only while the PR cannot merge (a conflict is judged again when main moves); else a
            # push to main would wake every waiting build's watch for nothing.
            base_sha=pull.base_sha if pull.mergeable is False and pull.state == "open" else None,
            state=pull.state, head_ref=pull.head_ref, merged_by=pull.merged_by, closed_by=closed_by,
            closed_at=pull.closed_at, branch_deleted=branch_deleted,
            head_sha=pull.head_sha, checks=v.state, failing_checks=v.failing, pending_checks=v.pending,
            optional_failing=v.optional_failing, overridden=v.overridden,
            required_checks=sorted(reported) if required.all_reported else required.names,
            required_source=required.source + (f" ({required.note})" if required.note else ""),
            changes_requested=bool(blocking), blocking_reviewers=blocking,
            ignored_reviewers=[x for x in requested if x not in blocking],
            approvals=sum(1 for _, st, _ in latest.values() if st == "APPROVED"),
            merged=pull.merged, merge_commit=pull.merge_commit_sha, github_approval=approval)

    async def _github_approval(self, number: int, head: str, latest) -> GitHubApproval | None:
        """An approving review of the current head, or an ``/approve-merge`` comment, by an operator."""
        for login, st, commit in latest.values():
            if st == "APPROVED" and commit == head and (verified := await self.operator(login)):
                return GitHubApproval(login=login, via="review", verified=verified)
        for c in await self.gh.list_issue_comments(number):
            if c.user_login and is_approve_command(c.body) and (verified := await self.operator(c.user_login)):
                return GitHubApproval(login=c.user_login, via="comment", url=c.html_url, verified=verified)
        return None


async def verify_operator(gh: GitHubClient | None, ops: OperatorSettings, login: str, *, strict: bool = True
                          ) -> str | None:
    """How ``login`` is a configured operator ("config:operators.logins", "team org/slug"), or None.

    ``strict``: an unreadable team membership (the token lacks organization members read) raises, so an
    operator command says why it was refused; the watch (not strict) just does not count that login."""
    if ops.lists(login):
        return "config:operators.logins"
    for team in ops.teams:
        if gh is None:
            raise NotAuthorized(f"operators.teams {team}: no [github] section to read team membership with")
        try:
            if await gh.team_membership(team, login) == "active":
                return f"team {team}"
        except GitHubError as e:
            if strict or e.status is None or e.status >= 500 or e.status == 429:
                raise
            activity.logger.warning(f"membership of {login} in {team} unreadable: {e}")
    return None


async def caller_identity(update_id: str | None) -> str | None:
    """The identity the Temporal server recorded for this update's caller (its ``UpdateAccepted`` event).

    Why from history: it is what the server stored for the request, not a field of the payload the caller
    wrote. (Temporal's identity is declared by the client SDK, by default ``pid@host``; the namespace's
    authentication — API key or mTLS — is what admitted the caller.)"""
    if not update_id:
        return None
    info = activity.info()
    handle = activity.client().get_workflow_handle(info.workflow_id, run_id=info.workflow_run_id)
    async for event in handle.fetch_history_events():
        if event.HasField("workflow_execution_update_accepted_event_attributes"):
            req = event.workflow_execution_update_accepted_event_attributes.accepted_request
            if req.meta.update_id == update_id:
                return req.meta.identity or None
    return None


def authorization_comment(inp: AuthorizeInput, verified: str, identity: str | None) -> str:
    """The PR comment recording an authorization (operator text rendered inert)."""
    auth = inp.authorization
    assert auth is not None
    lines = [f"Merge authorized by **{inert_markdown(auth.by)}** ({verified}"
             + (f"; Temporal identity `{inert_markdown(identity)}`" if identity else "") + ")."]
    if auth.note:
        lines.append(f"Note: {inert_markdown(auth.note)}")
    if auth.override_checks:
        names = ", ".join(f"`{inert_markdown(n)}`" for n in auth.override_checks)
        lines.append(f"Required check(s) overridden: {names}. Reason: {inert_markdown(auth.reason)}")
    lines.append("The merge follows as soon as the required checks are green.")
    return "\n\n".join(lines)


class OperatorActivities(ActivityGroup):
    def all(self) -> list:
        return [self.authorize_operator]

    @activity.defn
    async def authorize_operator(self, inp: AuthorizeInput) -> VerifiedOperator:
        """Verify an ``approve-merge``/``decide`` caller on the worker: a configured operator (by login or
        team, through the GitHub API), plus the server-recorded Temporal identity; an approval with an
        override or a note is recorded in the PR (one comment per authorization, edited on retry)."""
        gh = github_client(self.config)
        try:
            verified = await verify_operator(gh, self.config.operators, inp.by)
            if verified is None:
                raise NotAuthorized(
                    f"--by {inp.by}: not a configured operator (operators.logins / operators.teams); "
                    "ask an operator, or add the login to [operators] in the worker's configuration")
            identity = await caller_identity(inp.update_id)
            comment_url = None
            if inp.kind == "approve-merge" and inp.pr_number is not None and inp.authorization is not None and gh:
                marker = comment_marker(f"merge-authorization-{inp.request_id}-{inp.update_id or 'x'}")
                body = authorization_comment(inp, verified, identity)
                comment_url = (await gh.upsert_comment(inp.pr_number, marker, body)).html_url
            return VerifiedOperator(login=inp.by, verified=verified, temporal_identity=identity,
                                    comment_url=comment_url)
        finally:
            if gh is not None:
                await gh.aclose()
