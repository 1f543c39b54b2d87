"""The merge gate on real parts (Temporal dev server, Iris, registry, git, the GitHub stand-in serving branch
protection, reviews, comments and collaborators with GitHub's shapes): required checks only (#20.3),
authorization checked on the worker (#21.5), approval accepted at once and merged on green (#22.4)."""

from __future__ import annotations

import pytest
from temporalio.client import WorkflowHandle

from clients.github import GitHubClient
from domain.models import MergeAuthorization, PipelineReport, target_workflow_id
from domain.render import inert_markdown
from sandbox.stack import MARINSKYRL_SLUG
from tests.e2e.helpers import (
    awaiting_merge,
    report,
    request,
    start_pipeline,
    wait_until,
    waiting_on_visibility,
)
from workflows.pipeline import BuildPipelineWorkflow
from workflows.target import TargetBuildWorkflow

pytestmark = pytest.mark.stack
KEY = "amd64-standard"


def _protect(s, contexts: list[str]) -> None:
    """Branch protection on main requiring ``contexts``, readable: the token has admin (as a GitHub App with
    administration read would)."""
    s.github.set_permissions(MARINSKYRL_SLUG, admin=True, maintain=True, push=True, triage=True, pull=True)
    s.github.protect(MARINSKYRL_SLUG, "main", contexts)


async def _to_pr(s) -> tuple[WorkflowHandle, PipelineReport]:
    handle = await start_pipeline(s, request())
    await wait_until(lambda: waiting_on_visibility(s.client, handle.id, KEY), what="visibility wait")
    s.token_registry.set_public(s.image_repo_path, True)
    await s.client.get_workflow_handle(target_workflow_id(handle.id, KEY)).signal(TargetBuildWorkflow.recheck)
    return handle, await wait_until(lambda: awaiting_merge(s.client, handle.id), what="PR opened")


async def _review_where(s, wid: str, pred):
    async def check():
        rep = await report(s.client, wid)
        return rep if rep.review and pred(rep) else None
    return await wait_until(check, what="review state")


async def _comments(s, number: int) -> list[str]:
    async with GitHubClient(s.github.api_url, s.github.token, MARINSKYRL_SLUG) as gh:
        return [c.body for c in await gh.list_issue_comments(number)]


async def test_a_red_required_check_waits_and_an_override_merges_with_its_reason_in_the_pr(service_stack):
    s = service_stack
    _protect(s, ["ci"])
    handle, rep = await _to_pr(s)
    head, number = rep.pull_request.head_sha, rep.pull_request.number
    s.github.set_check(MARINSKYRL_SLUG, head, "lint", conclusion="failure")  # optional: shown, never blocking
    s.github.set_check(MARINSKYRL_SLUG, head, "ci", conclusion="failure")  # required: red
    rep = await _review_where(s, handle.id, lambda r: r.review.failing_checks == ["ci"])
    assert rep.review.optional_failing == ["lint"] and rep.review.required_checks == ["ci"]
    assert rep.review.required_source == "github:branch-protection"

    ack = await handle.execute_update(BuildPipelineWorkflow.approve_merge, MergeAuthorization(by="tester"))
    assert "accepted, waiting: required checks failing: ci" in ack and "--override-check" in ack
    rep = await _review_where(s, handle.id, lambda r: "authorized by tester" in r.waiting[0].detail)
    assert "waiting for required checks failing: ci" in rep.waiting[0].detail and not rep.review.merged

    reason = "ci is red on main for an unrelated flake (infra#12); the images are validated"
    ack = await handle.execute_update(BuildPipelineWorkflow.approve_merge, MergeAuthorization(
        by="tester", override_checks=["ci"], reason=reason))
    final: PipelineReport = await handle.result()

    assert final.status == "merged" and final.review.overridden == ["ci"]
    auth = final.merge_authorization
    assert auth and (auth.by, auth.override_checks, auth.reason) == ("tester", ["ci"], reason)
    assert auth.temporal_identity == s.client.identity and auth.verified == "config:operators.logins"
    bodies = await _comments(s, number)
    recorded = [b for b in bodies if "Merge authorized by **tester**" in b]
    assert len(recorded) == 2  # one comment per authorization: the first, and the override with its reason
    override = [b for b in recorded if "overridden" in b]
    assert len(override) == 1 and "`ci`" in override[0] and "unrelated flake \\(infra#\u200b12\\)" in override[0]
    assert f"Temporal identity `{inert_markdown(s.client.identity)}`" in override[0]  # as the server recorded it


async def test_approval_while_pending_merges_on_green_past_an_optional_failure_and_a_read_only_block(service_stack):
    s = service_stack
    _protect(s, ["ci"])
    handle, rep = await _to_pr(s)
    head, number = rep.pull_request.head_sha, rep.pull_request.number
    s.github.set_check(MARINSKYRL_SLUG, head, "lint", conclusion="failure")
    s.github.set_check(MARINSKYRL_SLUG, head, "ci", status="in_progress", conclusion=None)
    s.github.add_review(MARINSKYRL_SLUG, number, "CHANGES_REQUESTED", user="drive-by")  # read access only
    await _review_where(s, handle.id, lambda r: r.review.ignored_reviewers == ["drive-by"])

    ack = await handle.execute_update(BuildPipelineWorkflow.approve_merge, MergeAuthorization(by="tester"))
    assert "accepted and queued: required checks pending: ci" in ack
    s.github.set_check(MARINSKYRL_SLUG, head, "ci", conclusion="success")  # no second command after this
    final: PipelineReport = await handle.result()

    assert final.status == "merged" and "authorized by tester, config:operators.logins" in final.message
    assert final.review.optional_failing == ["lint"] and not final.review.changes_requested


async def test_an_approve_merge_comment_merges_only_from_a_configured_operator(service_stack):
    s = service_stack
    handle, rep = await _to_pr(s)  # unprotected main, no github.required_checks: every reported check counts
    head, number = rep.pull_request.head_sha, rep.pull_request.number
    s.github.set_check(MARINSKYRL_SLUG, head, "ci", conclusion="success")
    s.github.add_comment(MARINSKYRL_SLUG, number, "/approve-merge", user="mallory")
    s.github.set_check(MARINSKYRL_SLUG, head, "docs", conclusion="success")  # a change the watch reports
    rep = await _review_where(s, handle.id, lambda r: r.review.required_checks == ["ci", "docs"])
    assert rep.review.checks == "success" and rep.review.github_approval is None and not rep.review.merged
    assert rep.waiting[0].kind == "merge_authorization"  # mallory's comment authorized nothing

    s.github.add_comment(MARINSKYRL_SLUG, number, "/approve-merge\nimages checked", user="tester")
    final: PipelineReport = await handle.result()
    assert final.status == "merged" and "authorized by tester, config:operators.logins" in final.message
