"""The merge gate's GitHub reads against the stand-in, with GitHub's shapes and errors: required checks from
branch protection (403 without admin, 404 "Branch not protected" / "Required status checks not enabled")
and rulesets; reviewers' access (a read-only CHANGES_REQUESTED does not block); operators' approvals by
review or /approve-merge comment, and team membership read through the API."""

from __future__ import annotations

import pytest

from activities.merge_gate import GateReader, verify_operator
from clients.github import Forbidden
from domain.config import OperatorSettings
from tests.fixtures_github import GitHubStandinRepo

OPS = OperatorSettings(logins=["Ana"], teams=["acme/release"])


async def _pull(gh) -> int:
    return (await gh.ensure_pull("feature", "main", "pins", "body")).number


async def test_protection_needs_admin_and_says_unprotected_with_githubs_messages(github_standin: GitHubStandinRepo):
    h, repo = github_standin.handle, github_standin.repo
    async with github_standin.client() as gh:
        with pytest.raises(Forbidden) as denied:
            await gh.protection_required_checks("main")
        assert denied.value.status == 403 and "Resource not accessible" in denied.value.message
        h.set_permissions(repo, admin=True, push=True, pull=True)
        assert await gh.protection_required_checks("main") == []  # 404 Branch not protected
        h.protect(repo, "main", None)
        assert await gh.protection_required_checks("main") == []  # 404 Required status checks not enabled
        h.protect(repo, "main", ["ci", "e2e"])
        assert await gh.protection_required_checks("main") == ["ci", "e2e"]
        assert await gh.ruleset_required_checks("main") == []
        h.add_ruleset(repo, "main", ["build / lint"])
        h.add_ruleset(repo, "main", ["evaluate-only"], enforcement="evaluate")
        h.add_ruleset(repo, "release", ["other"])
        assert await gh.ruleset_required_checks("main") == ["build / lint"]


async def test_required_set_falls_back_to_configuration_when_protection_is_unreadable(github_standin):
    h, repo = github_standin.handle, github_standin.repo
    async with github_standin.client() as gh:
        req = await GateReader(gh, OPS, ["ci"]).required("main")
        assert req.names == ["ci"] and req.source == "config:github.required_checks"
        assert "403" in req.note and "administration read" in req.note
        h.add_ruleset(repo, "main", ["build"])
        req = await GateReader(gh, OPS, ["ci"]).required("main")
        assert req.names == ["build"] and req.source == "github:rulesets"  # GitHub's answer wins


async def test_review_state_counts_required_checks_writers_blocks_and_operator_approvals(github_standin):
    h, repo = github_standin.handle, github_standin.repo
    h.set_permissions(repo, admin=True, push=True, pull=True)
    h.protect(repo, "main", ["ci"])
    sha = github_standin.branch_sha("feature")
    async with github_standin.client() as gh:
        number = await _pull(gh)
        h.set_check(repo, sha, "ci", status="in_progress", conclusion=None)
        h.set_check(repo, sha, "lint", conclusion="failure")
        st = await GateReader(gh, OPS, []).state(number)
        assert (st.checks, st.pending_checks, st.optional_failing) == ("pending", ["ci"], ["lint"])
        assert st.required_checks == ["ci"] and st.required_source == "github:branch-protection"
        h.set_check(repo, sha, "ci", conclusion="success")
        st = await GateReader(gh, OPS, []).state(number)
        assert (st.checks, st.failing_checks, st.optional_failing) == ("success", [], ["lint"])

        # CHANGES_REQUESTED blocks only from an account with write access (maintain counts as write).
        h.add_review(repo, number, "CHANGES_REQUESTED", user="drive-by")  # read access (public repository)
        st = await GateReader(gh, OPS, []).state(number)
        assert not st.changes_requested and st.ignored_reviewers == ["drive-by"]
        h.set_collaborator(repo, "maint", "maintain")
        h.add_review(repo, number, "CHANGES_REQUESTED", user="maint")
        h.add_review(repo, number, "COMMENTED", user="maint")  # a comment does not lift the request
        st = await GateReader(gh, OPS, []).state(number)
        assert st.changes_requested and st.blocking_reviewers == ["maint"]
        h.add_review(repo, number, "APPROVED", user="maint")
        st = await GateReader(gh, OPS, []).state(number)
        assert not st.changes_requested and st.github_approval is None  # maint is no operator

        # /approve-merge from anyone else does nothing; from an operator (login or team member) it authorizes.
        h.add_comment(repo, number, "/approve-merge", user="mallory")
        assert (await GateReader(gh, OPS, []).state(number)).github_approval is None
        h.set_team("acme/release", ["carol"])
        h.add_comment(repo, number, "/approve-merge ship it", user="carol")
        st = await GateReader(gh, OPS, []).state(number)
        assert st.github_approval and (st.github_approval.login, st.github_approval.via) == ("carol", "comment")
        assert st.github_approval.verified == "team acme/release"
        h.add_review(repo, number, "APPROVED", user="ana")  # a configured login's review of the head
        st = await GateReader(gh, OPS, []).state(number)
        assert (st.github_approval.login, st.github_approval.via, st.github_approval.verified) == (
            "ana", "review", "config:operators.logins")


async def test_an_operator_is_a_listed_login_or_an_active_team_member(github_standin):
    github_standin.handle.set_team("acme/release", ["Carol"])
    async with github_standin.client() as gh:
        assert await verify_operator(gh, OPS, "ana") == "config:operators.logins"  # logins: case-insensitive
        assert await verify_operator(gh, OPS, "carol") == "team acme/release"
        assert await verify_operator(gh, OPS, "mallory") is None
        assert await gh.team_membership("acme/other", "carol") is None
        assert await gh.collaborator_permission("acme") == "admin"  # the owner
        assert await gh.collaborator_permission("someone") == "read"


async def test_the_gate_reads_who_closed_or_merged_a_pr_and_whether_its_branch_is_gone(github_standin):
    """What someone else did, as GitHub reports it: ``merged_by`` on the pull, ``closed_by`` only on the issue,
    and a deleted head branch (404 "Branch not found"), which closes its PR; re-opening it is refused."""
    h, repo = github_standin.handle, github_standin.repo
    h.add_token("bob-token", "bob")
    git = github_standin.work.git
    git.push("origin", "feature:refs/heads/by-push", "feature:refs/heads/by-api")
    async with github_standin.client() as gh:
        open_one = await gh.ensure_pull("by-api", "main", "pins", "body")
        st = await GateReader(gh, OPS, []).state(open_one.number)
        assert (st.state, st.closed_by, st.branch_deleted, st.head_ref) == ("open", None, False, "by-api")

        assert h.api("DELETE", f"/repos/{repo}/git/refs/heads/by-api", token="bob-token")[0] == 204
        assert h.api("DELETE", f"/repos/{repo}/git/refs/heads/by-api", token="bob-token") == (
            422, {"message": "Reference does not exist", "documentation_url": "https://docs.github.com/rest"})
        assert h.api("GET", f"/repos/{repo}/branches/by-api")[1]["message"] == "Branch not found"
        st = await GateReader(gh, OPS, []).state(open_one.number)
        assert (st.state, st.closed_by, st.branch_deleted, st.merged) == ("closed", "bob", True, False)
        status, refused = h.api("PATCH", f"/repos/{repo}/pulls/{open_one.number}", {"state": "open"})
        assert status == 422 and "by-api branch has been deleted" in refused["errors"][0]["message"]

        pushed = await gh.ensure_pull("by-push", "main", "pins", "body")
        git.push("origin", "--delete", "by-push")  # a git push, not the API: GitHub closes the PR all the same
        st = await GateReader(gh, OPS, []).state(pushed.number)
        assert (st.state, st.branch_deleted) == ("closed", True)

        merged = await gh.ensure_pull("feature", "main", "pins", "body")
        status, _ = h.api("PUT", f"/repos/{repo}/pulls/{merged.number}/merge", {}, token="bob-token")
        st = await GateReader(gh, OPS, []).state(merged.number)
        assert status == 200 and (st.merged, st.merged_by, st.branch_deleted) == (True, "bob", False)
