"""Merge only the head the service pushed (issue #34.5): someone force-pushes the build branch while the build
waits for its merge.

Real Temporal dev server, the worker's real record activities and webhook receiver, real git, and the GitHub
stand-in, where alice moves the branch (``push_as``: GitHub's repository activity names her, and ``push`` plus
``pull_request synchronize`` are delivered) and merges by hand with her own token. The PR watch polls every
120 s, so what the build shows promptly came from a webhook. Without the pin check, CI going green on alice's
head plus an operator's approval merged her head under the build's name, and a hand merge of it was reported
as "the pin table it merged holds the validated digests" without reading it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from pathlib import Path

import git
import pytest
from temporalio.client import WorkflowFailureError
from temporalio.common import SearchAttributePair, TypedSearchAttributes

from clients.github import HeadMoved
from domain.buildset import BuildRequest, CompatibilityRequest
from domain.models import (
    BundleSummary,
    MergeAuthorization,
    MergeWaitState,
    PipelineInput,
    PipelineReport,
    PullRequestInfo,
    SourceSnapshot,
    TargetResult,
)
from domain.pins import PinEntry, update_pin_table
from runtime import operator_client as oc
from runtime import search_attributes as sa
from tests.fixtures_github import STANDIN_REPO
from tests.workflows.test_terminal_outcomes import details
from tests.workflows.test_webhook_wake import SECRET, _config, _scheduled, _until
from worker import _webhooks, build_worker
from workflows.pipeline import BuildPipelineWorkflow

ALICE_TOKEN = "alice-token-not-a-secret"
HANG_GUARD_S = 90
PIN_TABLE = "cloud/iris/gpu_rl_images.py"
FIXTURE_TABLE = Path(__file__).resolve().parents[2] / "sandbox/fixtures/marinskyrl" / PIN_TABLE
VALIDATED = "sha256:" + "a1" * 32
THEIRS = "sha256:" + "b2" * 32
KEY = "amd64-standard"


def _commit_table(gh, branch: str, start: str, digest: str, message: str) -> str:
    """A commit on top of ``start`` whose pin table pins ``digest`` for amd64/standard; pushed as ``branch``."""
    work = gh.work
    work.git.fetch("origin")
    work.git.checkout("-B", f"tmp-{uuid.uuid4().hex[:6]}", start)
    path = Path(work.working_dir) / PIN_TABLE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(update_pin_table(FIXTURE_TABLE.read_text(), [PinEntry(
        architecture="amd64", variant="standard", digest=digest, tag="t1", source_commit="1" * 40,
        harbor_commit="2" * 40)]))
    work.git.add(PIN_TABLE)
    work.git.commit("-m", message)
    work.git.push("origin", f"HEAD:refs/heads/{branch}", "--force")
    return work.head.commit.hexsha


async def _start(client, config, gh, *, source: SourceSnapshot | None = None):
    """A pipeline in its merge wait on a PR whose head is the pin commit it pushed (what record leaves)."""
    wid = f"pinned-{uuid.uuid4().hex[:10]}"
    branch = config.repos.build_branch(wid)
    pin = _commit_table(gh, branch, "origin/feature", VALIDATED, "Pin GPU-RL images")
    async with gh.client() as c:
        pull = await c.ensure_pull(branch, "main", "pin images", "pinned head test")
    assert pull.head_sha == pin
    pr = PullRequestInfo(number=pull.number, url=pull.html_url or "", head_sha=pull.head_sha, pin_commit=pin)
    req = BuildRequest(architectures=["amd64"], variants=["standard"],
                       compatibility_request=CompatibilityRequest(requested_by="test", reason="pinned head"))
    target = TargetResult(key=KEY, architecture="amd64", variant="standard", status="validated", cluster="c",
                          job_ids=["/j/1"], tag="t1", image_ref="registry.invalid/gpu-rl:t1", digest=VALIDATED)
    rep = PipelineReport(workflow_id=wid, status="awaiting_merge", request=req, pull_request=pr, targets=[target],
                         source=source)
    handle = await client.start_workflow(
        BuildPipelineWorkflow.run, PipelineInput(request=req, request_id=wid, resume=MergeWaitState(report=rep)),
        id=wid, task_queue=config.temporal.task_queue,
        search_attributes=TypedSearchAttributes([SearchAttributePair(sa.STAGE, "awaiting_merge")]))
    return handle, pr, branch, pin


async def _waiting(handle, kind: str):
    rep = await handle.query(BuildPipelineWorkflow.report)
    return rep if rep.waiting and rep.waiting[0].kind == kind else None


async def _merge_inputs(handle) -> list[str]:
    """The sha every merge_pull_request the build scheduled was given."""
    events = [e async for e in handle.fetch_history_events()]
    ids = set(_scheduled(events, "merge_pull_request"))
    return [json.loads(e.activity_task_scheduled_event_attributes.input.payloads[0].data)["head_sha"]
            for e in events if e.event_id in ids]


@pytest.fixture
def alice(github_standin):
    github_standin.handle.add_token(ALICE_TOKEN, "alice")
    return ALICE_TOKEN


async def _force_pushed(gh, handle, pr, branch, pin) -> tuple[str, dict]:
    """Green on the pin commit, then alice force-pushes her own commit and CI turns green on it."""
    gh.handle.set_check(STANDIN_REPO, pin, "ci", conclusion="success")
    await _until(lambda: _waiting(handle, "merge_authorization"), "green on the pin commit", handle=handle)
    theirs = _commit_table(gh, f"side-{uuid.uuid4().hex[:6]}", "origin/feature", THEIRS, "alice's own pins")
    pushed = gh.handle.push_as(STANDIN_REPO, branch, theirs, "alice")
    assert pushed["activity_type"] == "force_push"
    gh.handle.set_check(STANDIN_REPO, theirs, "ci", conclusion="success")
    return theirs, pushed


async def test_a_force_pushed_branch_holds_the_merge_naming_who_and_the_restore_command_then_merges_the_pin(
        tmp_path, temporal_dev_server, temporal_client, github_standin, alice):
    config = _config(tmp_path, temporal_dev_server, github_standin)
    gh = github_standin.handle
    async with build_worker(temporal_client, config, graceful_shutdown_s=5), \
            _webhooks(temporal_client, config) as receiver:
        gh.set_webhook(f"http://127.0.0.1:{receiver.port}{config.github.webhook.path}", SECRET)
        handle, pr, branch, pin = await _start(temporal_client, config, github_standin)
        theirs, pushed = await _force_pushed(github_standin, handle, pr, branch, pin)

        rep = await _until(lambda: _waiting(handle, "head_moved"), "the moved head noticed", handle=handle)
        held = rep.waiting[0]
        assert f"the PR head is {theirs[:12]}, not the pin commit {pin[:12]} this build pushed" in held.detail
        assert f"force_push by alice at {pushed['timestamp']}" in held.detail
        url = config.repos.marinskyrl_url
        assert held.command == (f"git fetch {url} {pin} && git push --force-with-lease=refs/heads/{branch}:{theirs} "
                                f"{url} {pin}:refs/heads/{branch}")
        assert rep.review.foreign_head.pushed_by == "alice" and "merge of PR" in await details(handle)

        ack = await handle.execute_update(BuildPipelineWorkflow.approve_merge, MergeAuthorization(by="tester"))
        assert "accepted, held: the PR head is" in ack and "approve again" in ack
        reads = gh.served(r"^GET /repos/.*/pulls/\d+$")
        await _until(lambda: _more(gh, reads + 2), "the approval's re-read")
        assert await _merge_inputs(handle) == []  # green and approved, but not the pin commit: never merged
        async with github_standin.client() as c:
            assert not (await c.get_pull(pr.number)).merged

        # The printed command, run as printed in an empty repository, restores the pin commit.
        scratch = tmp_path / "restore"
        git.Repo.init(scratch)
        subprocess.run(["bash", "-c", held.command], cwd=scratch, check=True, capture_output=True)
        assert github_standin.branch_sha(branch) == pin
        gh.set_check(STANDIN_REPO, pin, "ci", conclusion="success")  # CI reports again: the webhook wakes it
        rep = await _until(lambda: _waiting(handle, "merge_authorization"), "the restored head noticed", handle=handle)
        assert rep.merge_authorization is None  # given for alice's head: it does not carry over
        await handle.execute_update(BuildPipelineWorkflow.approve_merge, MergeAuthorization(by="tester"))
        final: PipelineReport = await asyncio.wait_for(handle.result(), HANG_GUARD_S)
        merged_shas = await _merge_inputs(handle)

    assert final.status == "merged" and merged_shas == [pin]
    assert f"the pin table it merged ({PIN_TABLE} at {final.merge_commit[:12]}, read after the merge) holds the " \
           "validated digests" in final.message


async def test_a_hand_merge_of_someone_elses_head_is_reported_from_the_pin_table_it_really_merged(
        tmp_path, temporal_dev_server, temporal_client, github_standin, alice):
    config = _config(tmp_path, temporal_dev_server, github_standin)
    gh = github_standin.handle
    async with build_worker(temporal_client, config, graceful_shutdown_s=5), \
            _webhooks(temporal_client, config) as receiver:
        gh.set_webhook(f"http://127.0.0.1:{receiver.port}{config.github.webhook.path}", SECRET)
        handle, pr, branch, pin = await _start(temporal_client, config, github_standin)
        theirs, _ = await _force_pushed(github_standin, handle, pr, branch, pin)
        await _until(lambda: _waiting(handle, "head_moved"), "the moved head noticed", handle=handle)
        status, merged = gh.api("PUT", f"/repos/{STANDIN_REPO}/pulls/{pr.number}/merge", {}, token=alice)
        assert status == 200 and merged["merged"]
        with pytest.raises(WorkflowFailureError):
            await asyncio.wait_for(handle.result(), HANG_GUARD_S)
        rep = await oc.read_report(temporal_client, handle.id)
        assert await _merge_inputs(handle) == []

    f = rep.failure
    assert rep.status == "cancelled" and (f.failure_class, f.error_type) == ("merged_other_head", "MergedOtherHead")
    assert f"PR #{pr.number} was merged on GitHub by alice, outside the service, as {merged['sha']}" in f.message
    assert (f"the pin table it merged ({PIN_TABLE} at {merged['sha'][:12]}) does not hold the validated digests: "
            f"{KEY} pins {THEIRS}, not the validated {VALIDATED}") in f.message
    assert f"at head {theirs[:12]} (force_push by alice" in f.message and "holds the validated" not in f.message
    assert rep.merge_commit == merged["sha"] and f"git show {merged['sha']}:{PIN_TABLE}" in f.next_step


# Retried once, visibly: CI at c8eeed2 failed here with the merge wait starting a new PR watch every ~0.33 s for
# 30 s and never showing green; not reproduced in 10 loaded runs. A timeout now prints the build's history
# digest (tests/workflows/history_digest.py), which the rerun keeps in the output.
@pytest.mark.flaky(reruns=1)
async def test_a_hand_merge_where_the_pr_body_carries_the_digests_claims_nothing_about_a_pin_table(
        tmp_path, temporal_dev_server, temporal_client, github_standin, alice):
    """digests_in = pr_body (the repository has no pin table by the plan): whatever file sits at the table's
    path is not this build's record, so the report neither claims it holds the validated digests nor ends the
    build over it."""
    config = _config(tmp_path, temporal_dev_server, github_standin)
    gh = github_standin.handle
    source = SourceSnapshot(build_commit="1" * 40, base_commit="1" * 40, branch="b", pushed=True,
                            created_commit=False, harbor_commit="2" * 40, harbor_diff=None, changed_files=[],
                            ops_doc_corrected=False, bundle=BundleSummary(sha256="f" * 64, size_bytes=1, file_count=1),
                            digests_in="pr_body")
    async with build_worker(temporal_client, config, graceful_shutdown_s=5), \
            _webhooks(temporal_client, config) as receiver:
        gh.set_webhook(f"http://127.0.0.1:{receiver.port}{config.github.webhook.path}", SECRET)
        handle, pr, _, _ = await _start(temporal_client, config, github_standin, source=source)
        gh.set_check(STANDIN_REPO, pr.head_sha, "ci", conclusion="success")
        await _until(lambda: _waiting(handle, "merge_authorization"), "green", handle=handle)
        status, merged = gh.api("PUT", f"/repos/{STANDIN_REPO}/pulls/{pr.number}/merge", {}, token=alice)
        assert status == 200
        final: PipelineReport = await asyncio.wait_for(handle.result(), HANG_GUARD_S)
    assert final.status == "merged" and final.message.endswith("the pin table it merged was not read (unchecked)")


async def test_github_refuses_a_merge_given_a_sha_the_head_moved_from(github_standin):
    """The stand-in answers like GitHub: the merge call's ``sha`` must be the head (409 otherwise)."""
    gh = github_standin
    branch = f"b-{uuid.uuid4().hex[:6]}"
    pin = _commit_table(gh, branch, "origin/feature", VALIDATED, "pin")
    async with gh.client() as c:
        pull = await c.ensure_pull(branch, "main", "t", "b")
        theirs = _commit_table(gh, f"side-{uuid.uuid4().hex[:6]}", "origin/feature", THEIRS, "theirs")
        gh.handle.push_as(STANDIN_REPO, branch, theirs, "alice")
        with pytest.raises(HeadMoved) as e:
            await c.merge_pull(pull.number, pin)
        assert e.value.status == 409 and "Head branch was modified. Review and try the merge again." in str(e.value)
        assert not (await c.get_pull(pull.number)).merged
        pushes = await c.ref_activity(branch)
    assert [(p.after, p.actor, p.activity_type) for p in pushes][:1] == [(theirs, "alice", "force_push")]


async def _more(gh, n: int) -> bool:
    return gh.served(r"^GET /repos/.*/pulls/\d+$") >= n
