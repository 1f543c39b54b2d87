"""Someone else ends what a build waits for (issue #28.1): a PR closed or merged by hand, the build branch
deleted, a pinned tag moved or the package made private while the build waits for its merge.

Real Temporal dev server, the worker's real record activities and webhook receiver, the GitHub stand-in
(acting as a person through its REST API with that person's token) and the real local registry (token
auth, visibility switchable). The PR watch polls every 120 s in the GitHub tests, so a build that ends
promptly can only have been woken by the webhook (its history holds the ``github_changed`` signal); the
registry test polls fast, since registries send no webhooks here. Without the handling, a closed PR or a
deleted branch leaves the build waiting (the hang guard fails the test) and a moved tag is merged."""

from __future__ import annotations

import asyncio
import uuid

import git
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError
from temporalio.common import SearchAttributePair, TypedSearchAttributes

from domain.buildset import BuildRequest, CompatibilityRequest
from domain.config import ServiceConfig
from domain.models import (
    MergeAuthorization,
    MergeWaitState,
    PipelineInput,
    PipelineReport,
    PullRequestInfo,
    TargetResult,
)
from domain.report import report_markdown
from runtime import operator_client as oc
from runtime import search_attributes as sa
from tests.fixtures_github import STANDIN_REPO
from tests.registry.imagepush import ImageSpec, Pusher
from tests.workflows.test_terminal_outcomes import details
from tests.workflows.test_webhook_wake import SECRET, _config, _delivered, _signals, _until
from worker import _webhooks, build_worker
from workflows.pipeline import BuildPipelineWorkflow

ALICE_TOKEN = "alice-token-not-a-secret"
HANG_GUARD_S = 90  # the 120 s poll is never what ends these builds; without the fix they never end


async def _start(client, config: ServiceConfig, gh, *, targets: list[TargetResult] | None = None):
    """A pipeline in its merge wait on a PR of its own build branch (what the record step leaves behind)."""
    wid = f"outside-{uuid.uuid4().hex[:10]}"
    branch = config.repos.build_branch(wid)
    git.Repo(gh.bare).git.branch(branch, "feature")
    async with gh.client() as c:
        pull = await c.ensure_pull(branch, "main", "pin images", "outside actions test")
    pr = PullRequestInfo(number=pull.number, url=pull.html_url or "", head_sha=pull.head_sha)
    req = BuildRequest(architectures=["amd64"], variants=["standard"],
                       compatibility_request=CompatibilityRequest(requested_by="test", reason="outside actions"))
    rep = PipelineReport(workflow_id=wid, status="awaiting_merge", request=req, pull_request=pr, targets=targets or [])
    handle = await client.start_workflow(
        BuildPipelineWorkflow.run, PipelineInput(request=req, request_id=wid, resume=MergeWaitState(report=rep)),
        id=wid, task_queue=config.temporal.task_queue,
        search_attributes=TypedSearchAttributes([SearchAttributePair(sa.STAGE, "awaiting_merge")]))
    return handle, pr, branch


async def _watching(gh, handle) -> None:
    """Until the build's watch has read the PR and waits for a change (its first look, then the watch)."""
    async def done():
        return gh.handle.served(r"^GET /repos/.*/check-runs$") >= 2
    await _until(done, "the watch waiting for a change")


async def _ended(client, handle) -> PipelineReport:
    with pytest.raises(WorkflowFailureError):
        await asyncio.wait_for(handle.result(), HANG_GUARD_S)  # a hang guard, not a timing
    return await oc.read_report(client, handle.id)  # what `starter.py report/follow` print


async def _attrs(handle) -> tuple[str | None, str | None]:
    found = (await handle.describe()).typed_search_attributes
    return found.get(sa.STAGE), found.get(sa.FAILURE_CLASS)


@pytest.fixture
def alice(github_standin):
    github_standin.handle.add_token(ALICE_TOKEN, "alice")
    return ALICE_TOKEN


async def test_a_pr_closed_by_hand_ends_the_build_cancelled_naming_who_and_the_next_step(
        tmp_path, temporal_dev_server, temporal_client, github_standin, alice):
    config = _config(tmp_path, temporal_dev_server, github_standin)
    gh = github_standin.handle
    async with build_worker(temporal_client, config, graceful_shutdown_s=5), \
            _webhooks(temporal_client, config) as receiver:
        handle, pr, _ = await _start(temporal_client, config, github_standin)
        gh.set_webhook(f"http://127.0.0.1:{receiver.port}{config.github.webhook.path}", SECRET)
        await _watching(github_standin, handle)
        status, closed = gh.api("PATCH", f"/repos/{STANDIN_REPO}/pulls/{pr.number}", {"state": "closed"}, token=alice)
        assert status == 200 and closed["state"] == "closed" and not closed["merged"]
        rep = await _ended(temporal_client, handle)
        shown = await details(handle)
        stage, failure_class = await _attrs(handle)
        events = [e async for e in handle.fetch_history_events()]

    f = rep.failure
    assert rep.status == "cancelled" and f.failure_class == "pr_closed" and f.error_type == "PullRequestClosed"
    assert f"PR #{pr.number}" in f.message and "closed unmerged on GitHub by alice at " in f.message
    assert f"re-open PR #{pr.number}" in f.next_step and f"python starter.py resume {handle.id}" in f.next_step
    assert (stage, failure_class) == ("cancelled", "pr_closed")
    assert "**Cancelled** (pr_closed, PullRequestClosed)" in shown and "**Next step:** if it should merge" in shown
    assert "**Cancelled** (pr_closed" in report_markdown(rep) and not rep.waiting
    # Woken by GitHub's pull_request "closed" delivery, not the 120 s poll.
    assert "pull_request" in [s["event"] for s in _signals(events)]
    assert not [e for e in events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
                and e.activity_task_scheduled_event_attributes.activity_type.name == "merge_pull_request"]


async def test_the_build_branch_deleted_ends_the_build_naming_the_branch_and_how_to_take_it_up_again(
        tmp_path, temporal_dev_server, temporal_client, github_standin, alice):
    config = _config(tmp_path, temporal_dev_server, github_standin)
    gh = github_standin.handle
    async with build_worker(temporal_client, config, graceful_shutdown_s=5), \
            _webhooks(temporal_client, config) as receiver:
        handle, pr, branch = await _start(temporal_client, config, github_standin)
        gh.set_webhook(f"http://127.0.0.1:{receiver.port}{config.github.webhook.path}", SECRET)
        await _watching(github_standin, handle)
        status, _ = gh.api("DELETE", f"/repos/{STANDIN_REPO}/git/refs/heads/{branch}", token=alice)
        assert status == 204
        rep = await _ended(temporal_client, handle)
        stage, failure_class = await _attrs(handle)
        events = [e async for e in handle.fetch_history_events()]
        delete = await _delivered(github_standin, "delete")
        # GitHub's answers the service read: the branch is gone, and the PR cannot be re-opened without it.
        assert gh.api("GET", f"/repos/{STANDIN_REPO}/branches/{branch}")[0] == 404
        assert gh.api("PATCH", f"/repos/{STANDIN_REPO}/pulls/{pr.number}", {"state": "open"})[0] == 422

    f = rep.failure
    assert rep.status == "cancelled" and (f.failure_class, f.error_type) == ("branch_deleted", "BranchDeleted")
    assert f"the build branch {branch} was deleted" in f.message and "by alice" in f.message
    assert f"python starter.py resume {handle.id}" in f.next_step and f"pushes {branch} again" in f.next_step
    assert (stage, failure_class) == ("cancelled", "branch_deleted")
    assert [(d["payload"]["ref"], d["status"]) for d in delete] == [(branch, 202)]  # the receiver woke the build
    assert "delete" in [s["event"] for s in _signals(events)]


async def test_a_pr_merged_by_hand_ends_the_build_done_with_the_merge_commit_and_who_merged(
        tmp_path, temporal_dev_server, temporal_client, github_standin, alice):
    config = _config(tmp_path, temporal_dev_server, github_standin)
    gh = github_standin.handle
    async with build_worker(temporal_client, config, graceful_shutdown_s=5), \
            _webhooks(temporal_client, config) as receiver:
        handle, pr, _ = await _start(temporal_client, config, github_standin)
        gh.set_webhook(f"http://127.0.0.1:{receiver.port}{config.github.webhook.path}", SECRET)
        await _watching(github_standin, handle)
        status, merged = gh.api("PUT", f"/repos/{STANDIN_REPO}/pulls/{pr.number}/merge", {}, token=alice)
        assert status == 200 and merged["merged"]
        final: PipelineReport = await asyncio.wait_for(handle.result(), HANG_GUARD_S)
        shown = await details(handle)
        stage, failure_class = await _attrs(handle)

    assert final.status == "merged" and final.merge_commit == merged["sha"]
    assert f"PR #{pr.number} was merged on GitHub by alice, outside the service, as {merged['sha']}" in final.message
    assert final.pull_request.merged_by == "alice" and (stage, failure_class) == ("done", None)
    assert f"merged as `{merged['sha']}` by alice" in shown


# ---------------------------------------------------------------- the registry, changed by someone else
async def test_a_tag_moved_or_a_package_made_private_while_waiting_holds_the_merge_until_restored(
        tmp_path, temporal_dev_server, temporal_client, github_standin, token_registry, monkeypatch):
    """The PR pins the validated digest. Someone moves the tag: the wait says so (report, UI, failure class
    ``tag_moved``, a PR comment) and holds the merge; restoring the tag releases it. Someone makes the
    package private: held again (``visibility``); an operator's approval is accepted but does not merge
    until the package is public again, then the merge follows by itself."""
    repo = f"lab/outside-{uuid.uuid4().hex[:8]}"
    token_registry.set_public(repo, True)
    pusher = Pusher(token_registry.url, token_registry.credentials)
    try:
        validated = await pusher.push_image(repo, "t1", ImageSpec(seed="validated"))
        config = _config(tmp_path, temporal_dev_server, github_standin)
        (tmp_path / "secrets" / "registry-token").write_text(token_registry.credentials[1])
        raw = config.model_dump(mode="json")
        raw["registry"].update(image_repository=f"{token_registry.host}/{repo}", insecure_hosts=[token_registry.host],
                               user={"kind": "literal_public", "value": token_registry.credentials[0]})
        raw["policy"].update(merge_watch_interval_s=0.3, merge_watch_authorized_interval_s=0.3,
                             merge_watch_registry_interval_s=0.2)
        raw["github"].pop("webhook")
        config = ServiceConfig.model_validate(raw)
        gh = github_standin.handle
        target = TargetResult(key="amd64-standard", architecture="amd64", variant="standard", status="validated",
                              cluster="c", job_ids=["/j/1"], tag="t1", image_ref=f"{token_registry.host}/{repo}:t1",
                              digest=validated.digest)
        async with build_worker(temporal_client, config, graceful_shutdown_s=5):
            handle, pr, _ = await _start(temporal_client, config, github_standin, targets=[target])
            gh.set_check(STANDIN_REPO, pr.head_sha, "ci", conclusion="success")

            async def waiting(kind: str | None):
                rep = await handle.query(BuildPipelineWorkflow.report)
                kinds = [w.kind for w in rep.waiting]
                ok = ("registry_drift" in kinds) if kind else (kinds == ["merge_authorization"])
                return rep if ok and (not kind or kind in rep.waiting[-1].detail) else None

            await _until(lambda: waiting(None), "green, awaiting authorization, no drift")
            moved = await pusher.push_image(repo, "t1", ImageSpec(seed="someone-else"))
            rep = await _until(lambda: waiting(f"now points at {moved.digest}"), "the moved tag noticed")
            held = rep.waiting[-1]
            assert f"not the validated {validated.digest}" in held.detail and "the PR still pins" in held.detail
            assert held.command == (f"skopeo copy --all docker://{token_registry.host}/{repo}@{validated.digest} "
                                    f"docker://{token_registry.host}/{repo}:t1")
            assert f"python starter.py cancel {handle.id}" in held.detail
            assert (await _attrs(handle)) == ("awaiting_merge", "tag_moved")
            assert f"merge of PR #{pr.number} held" in await details(handle)
            async with github_standin.client() as c:
                comments = await c.list_issue_comments(pr.number)
            assert any(moved.digest in x.body and "pins the validated digests" in x.body for x in comments)

            await pusher.push_image(repo, "t1", ImageSpec(seed="validated"))  # restored: same digest again
            await _until(lambda: waiting(None), "the restored tag noticed")
            assert (await _attrs(handle)) == ("awaiting_merge", None)

            token_registry.set_public(repo, False)
            await _until(lambda: waiting("no longer anonymously pullable"), "the private package noticed")
            assert (await _attrs(handle)) == ("awaiting_merge", "visibility")
            held = (await handle.query(BuildPipelineWorkflow.report)).waiting[-1]
            assert f"make {token_registry.host}/{repo} public again" in held.detail and held.command is None
            ack = await handle.execute_update(BuildPipelineWorkflow.approve_merge, MergeAuthorization(by="tester"))
            assert "registry changed since validation" in ack and "no longer anonymously pullable" in ack
            reads = gh.served(r"^GET /repos/.*/check-runs$")
            await _until(lambda: _served_more(gh, reads + 3), "more looks after the approval")
            async with github_standin.client() as c:
                assert not (await c.get_pull(pr.number)).merged  # held: approved, green, but the package is private

            token_registry.set_public(repo, True)
            final: PipelineReport = await asyncio.wait_for(handle.result(), HANG_GUARD_S)
            async with github_standin.client() as c:
                comments = await c.list_issue_comments(pr.number)
    finally:
        await pusher.aclose()
    assert final.status == "merged" and "authorized by tester" in final.message
    assert any("resolved" in x.body for x in comments if "Registry changed since validation" in x.body)


async def _served_more(gh, n: int) -> bool:
    return gh.served(r"^GET /repos/.*/check-runs$") >= n
