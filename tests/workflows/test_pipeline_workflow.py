"""BuildPipelineWorkflow on scripted outcomes: plan-only, a failed target blocks recording, and the merge
gate (approval accepted at once whatever the checks; merge when the required checks are green or overridden,
by a configured operator only, at the reviewed head).
Time-skipping server, real parent and child workflows, stand-in activities."""

from __future__ import annotations

import asyncio
import gc
import logging
import uuid

import pytest
from temporalio.client import WorkflowFailureError, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError

from domain.models import GitHubApproval, MergeAuthorization, PipelineInput, PipelineReport, Stage
from domain.report import report_markdown
from runtime import search_attributes as sa
from tests.contract.helpers import COMMIT
from tests.workflows.standins import (
    MANIFEST_MISMATCH,
    MERGE_COMMIT,
    PR_HEAD,
    Round,
    Standins,
    eventually,
    request,
    result,
    review,
    worker,
)
from tests.workflows.test_terminal_outcomes import details
from workflows.pipeline import BuildPipelineWorkflow
from workflows.target import TargetBuildWorkflow

NEW_HEAD = "9" * 40  # the PR head moved after recording (e.g. CI rebased): merge must use the reviewed head


def _ids() -> tuple[str, str]:
    u = uuid.uuid4().hex[:8]
    return f"pipeline-test-{u}", f"tq-{u}"


async def _start(env, tq: str, wid: str, req=None, *, plan_only: bool = False):
    inp = PipelineInput(request=req or request(), request_id=wid, plan_only=plan_only, source_commit=COMMIT)
    return await env.client.start_workflow(BuildPipelineWorkflow.run, inp, id=wid, task_queue=tq)


async def _report(handle) -> PipelineReport:
    return await handle.query(BuildPipelineWorkflow.report)


async def _refused(handle, auth: MergeAuthorization) -> str:
    with pytest.raises(WorkflowUpdateFailedError) as info:
        await handle.execute_update(BuildPipelineWorkflow.approve_merge, auth)
    return str(info.value.cause)


async def _children(handle) -> list[str]:
    history = await handle.fetch_history()
    return [e.start_child_workflow_execution_initiated_event_attributes.workflow_id for e in history.events
            if e.HasField("start_child_workflow_execution_initiated_event_attributes")]


async def test_plan_only_returns_the_plan_without_starting_children(time_skipping_env):
    wid, tq = _ids()
    s = Standins()
    async with worker(time_skipping_env.client, tq, s):
        handle = await _start(time_skipping_env, tq, wid, request(archs=("amd64", "arm64")), plan_only=True)
        rep: PipelineReport = await result(handle)
        stage = await handle.query(BuildPipelineWorkflow.stage)

    assert stage == Stage.PLANNED.value
    assert rep.status == "planned" and "nothing submitted" in rep.message
    assert [t.key for t in rep.plan] == ["amd64-standard", "arm64-standard"]
    assert [p.push for p in s.names("prepare_source")] == [False]
    assert s.names("submit_job") == [] and s.names("record_artifact") == []
    assert s.names("publish_source") == []  # a plan pushes no build branch
    assert await _children(handle) == []
    # Started without BuildKind: it tags itself a plan, so the default build list leaves it out.
    assert (await handle.describe()).typed_search_attributes.get(sa.KIND) == "plan"


async def test_a_failed_target_fails_the_pipeline_and_nothing_is_recorded(time_skipping_env):
    wid, tq = _ids()
    s = Standins(rounds={"amd64-megatron": [Round(state="failed", evidence=MANIFEST_MISMATCH)]})
    async with worker(time_skipping_env.client, tq, s):
        handle = await _start(time_skipping_env, tq, wid, request(variants=("standard", "megatron")))
        with pytest.raises(WorkflowFailureError) as info:
            await result(handle)
        stage = await handle.query(BuildPipelineWorkflow.stage)

    cause = info.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "BuildFailed"
    rep = PipelineReport.model_validate(cause.details[0])
    by_key = {t.key: t for t in rep.targets}
    assert by_key["amd64-standard"].status == "validated"
    assert by_key["amd64-megatron"].status == "failed"
    assert by_key["amd64-megatron"].failures[0].failure_class == "input_error"
    assert "amd64-megatron: input_error failure" in cause.message and "amd64-standard" not in cause.message
    assert rep.status == "failed" and stage == Stage.FAILED.value
    assert s.names("record_artifact") == [] and s.names("watch_pull_request") == []
    assert sorted(await _children(handle)) == [f"{wid}/amd64-megatron", f"{wid}/amd64-standard"]


async def test_approval_while_pending_is_accepted_at_once_and_the_merge_follows_green(own_time_skipping_env, caplog):
    """#22.4: approve-merge is never bounced by pending checks; the merge follows them turning green, at the
    head GitHub shows then, without a second command. Refusals left: no --by, not an operator, twice."""
    caplog.set_level(logging.ERROR)
    env = own_time_skipping_env
    wid, tq = _ids()
    s = Standins(reviews=[review("pending")])
    async with worker(env.client, tq, s):
        handle = await _start(env, tq, wid)

        async def review_is(checks: str, changes: bool = False):
            rep = await _report(handle)
            return rep if rep.review and (rep.review.checks, rep.review.changes_requested) == (checks, changes) \
                else None

        rep = await eventually(lambda: review_is("pending"), what="awaiting merge, checks pending")
        assert [(w.kind, w.command) for w in rep.waiting] == [("merge_checks", None)]  # CI, not an operator
        assert "approve-merge is accepted now" in rep.waiting[0].detail
        assert rep.status == "awaiting_merge" and rep.pull_request and rep.pull_request.number == 7
        assert await handle.query(BuildPipelineWorkflow.stage) == Stage.AWAITING_MERGE.value
        assert "--by" in await _refused(handle, MergeAuthorization(by="  "))
        assert "mallory: not a configured operator" in await _refused(handle, MergeAuthorization(by="mallory"))
        assert s.names("merge_pull_request") == []

        ack = await handle.execute_update(BuildPipelineWorkflow.approve_merge, MergeAuthorization(by="ana"))
        assert ack.startswith("merge authorized by ana (config:operators.logins")
        assert "accepted and queued" in ack and "as soon as they are green" in ack
        assert "already authorized by ana" in await _refused(handle, MergeAuthorization(by="bob"))
        rep = await _report(handle)
        assert "authorized by ana" in rep.waiting[0].detail and "waiting for required checks" in rep.waiting[0].detail
        assert s.names("merge_pull_request") == []  # still pending: nothing merged

        s.set_review(review("success"))  # CI turns green on the approved head
        rep = await result(handle)
        stage = await handle.query(BuildPipelineWorkflow.stage)
        shown = await details(handle)

    assert rep.status == "merged" and rep.merge_commit == MERGE_COMMIT
    # The UI's Current Details of a merged build: the PR, its merge commit and each target's digest.
    digest = rep.targets[0].digest
    assert digest and f"`{digest}`" in shown and "| digest |" in shown, shown
    assert f"**PR** [#7]({rep.pull_request.url}) — merged as `{MERGE_COMMIT}`" in shown, shown

    assert "authorized by ana, config:operators.logins" in rep.message
    assert rep.merge_authorization and rep.merge_authorization.temporal_identity == env.client.identity
    assert f"Merge authorized by ana (temporal; config:operators.logins; Temporal identity {env.client.identity})" \
        in report_markdown(rep)
    assert rep.pull_request.merged and rep.pull_request.merge_commit == MERGE_COMMIT
    merges = s.names("merge_pull_request")
    assert [(m.pr_number, m.head_sha, m.authorization.by) for m in merges] == [(7, PR_HEAD, "ana")]
    assert merges[0].authorization.verified == "config:operators.logins"
    assert merges[0].authorization.temporal_identity == env.client.identity  # as the server recorded it
    authorized = s.names("authorize_operator")
    assert [(a.kind, a.by) for a in authorized] == [("approve-merge", "mallory"), ("approve-merge", "ana")]
    watches = s.names("watch_pull_request")
    after = [i for i, w in enumerate(watches) if w.authorized]
    assert watches[after[0]].last is None  # the approval woke the watch: GitHub was read again at once
    assert all(w.last is not None for w in watches[after[0] + 1:])  # then only on change, not in a loop
    recorded = s.names("record_artifact")
    assert len(recorded) == 1 and [t.status for t in recorded[0].targets] == ["validated"]
    assert recorded[0].source.build_commit == COMMIT
    assert stage == Stage.DONE.value
    desc = await handle.describe()
    assert desc.typed_search_attributes.get(sa.STAGE) == "done"
    assert desc.typed_search_attributes.get(sa.SOURCE_COMMIT) == COMMIT
    assert desc.typed_search_attributes.get(sa.KIND) == "build"  # started without one: tagged itself
    memo = await desc.memo_value("summary")
    assert "amd64-standard: validated sha256:" in memo and "stage done" in memo
    child = await env.client.get_workflow_handle_for(TargetBuildWorkflow.run, f"{wid}/amd64-standard").describe()
    assert child.typed_search_attributes.get(sa.ARCHITECTURE) == "amd64"
    assert child.typed_search_attributes.get(sa.VARIANT) == "standard"
    assert child.typed_search_attributes.get(sa.STAGE) == "done"
    # Cancelling the PR watch on authorization is normal: asyncio reports no unretrieved error.
    gc.collect()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


async def test_a_red_required_check_waits_until_an_override_with_its_reason(own_time_skipping_env):
    """#20.3: an approval while a required check is red is accepted but waits; an operator's override (with a
    reason, recorded by the authorize step in the PR) merges; a blocking review waits the same way."""
    env = own_time_skipping_env
    wid, tq = _ids()
    red = review("failure", failing=["ci"]).model_copy(update={"required_checks": ["ci"],
                                                              "required_source": "github:branch-protection"})
    s = Standins(reviews=[red])
    async with worker(env.client, tq, s):
        handle = await _start(env, tq, wid)

        async def seen(state):
            rep = await _report(handle)
            return rep if rep.review == state else None
        await eventually(lambda: seen(red), what="required check red")
        ack = await handle.execute_update(BuildPipelineWorkflow.approve_merge, MergeAuthorization(by="ana"))
        assert "accepted, waiting: required checks failing: ci" in ack and "--override-check" in ack
        await eventually(lambda: _authorized_watch(s), what="the watch re-read after the approval")
        assert s.names("merge_pull_request") == []
        assert "--reason" in await _refused(handle, MergeAuthorization(by="bob", override_checks=["ci"]))
        # The override goes to the watch, which then reports the check overridden and the gate green.
        s.override_answer = red.model_copy(update={"checks": "success", "failing_checks": [], "overridden": ["ci"]})
        ack = await handle.execute_update(BuildPipelineWorkflow.approve_merge, MergeAuthorization(
            by="bob", override_checks=["ci"], reason="ci is broken on main (infra#12), the image is validated"))
        assert "merging now" in ack
        rep = await result(handle)

    assert rep.status == "merged"
    merges = s.names("merge_pull_request")
    assert len(merges) == 1 and merges[0].authorization.by == "bob"
    assert merges[0].authorization.override_checks == ["ci"]
    override = [a for a in s.names("authorize_operator") if a.authorization.override_checks]
    assert [a.authorization.reason for a in override] == ["ci is broken on main (infra#12), the image is validated"]
    assert any(w.overrides == ["ci"] for w in s.names("watch_pull_request"))


async def _authorized_watch(s: Standins) -> bool:
    return any(w.authorized for w in s.names("watch_pull_request"))


async def test_a_new_head_after_authorization_withdraws_it_and_holds_the_merge_until_the_pin_commit_is_back(
        own_time_skipping_env):
    """Someone pushed over the pin commit: green, but not what ana approved, and not what the service pushed
    (#34.5): held whatever the approvals; once the pin commit is back, a new approval merges it, at its sha."""
    env = own_time_skipping_env
    wid, tq = _ids()
    s = Standins(reviews=[review("pending")])
    async with worker(env.client, tq, s):
        handle = await _start(env, tq, wid)

        async def pending_seen():
            rep = await _report(handle)
            return rep.review is not None
        await eventually(pending_seen, what="awaiting merge")
        await handle.execute_update(BuildPipelineWorkflow.approve_merge, MergeAuthorization(by="ana"))
        s.set_review(review("success", head=NEW_HEAD))

        async def held():
            rep = await _report(handle)
            return rep if rep.review and rep.review.head_sha == NEW_HEAD and rep.waiting and \
                rep.waiting[0].kind == "head_moved" else None
        rep = await eventually(held, what="held on the new head")
        assert rep.merge_authorization is None and f"not the pin commit {PR_HEAD[:12]}" in rep.waiting[0].detail
        ack = await handle.execute_update(BuildPipelineWorkflow.approve_merge, MergeAuthorization(by="bob"))
        assert "accepted, held" in ack
        s.set_review(review("success"))  # the pin commit restored

        async def restored():
            rep = await _report(handle)
            return rep if rep.review and rep.review.head_sha == PR_HEAD and rep.waiting and \
                rep.waiting[0].kind == "merge_authorization" else None
        await eventually(restored, what="authorization withdrawn on the restored head")
        assert s.names("merge_pull_request") == []
        await handle.execute_update(BuildPipelineWorkflow.approve_merge, MergeAuthorization(by="bob"))
        rep = await result(handle)
    assert rep.status == "merged"
    assert [(m.head_sha, m.authorization.by) for m in s.names("merge_pull_request")] == [(PR_HEAD, "bob")]


async def test_an_operators_approval_on_github_merges_without_a_command(time_skipping_env):
    """The watch found an approving review (or /approve-merge comment) by a configured operator."""
    wid, tq = _ids()
    approved = review("success").model_copy(update={"github_approval": GitHubApproval(
        login="carol", via="comment", url="http://github.invalid/pull/7#c1", verified="team org/ops")})
    s = Standins(reviews=[approved], operators={"carol"})
    async with worker(time_skipping_env.client, tq, s):
        rep = await result(await _start(time_skipping_env, tq, wid))
    assert rep.status == "merged" and "authorized by carol, team org/ops" in rep.message
    merges = s.names("merge_pull_request")
    assert len(merges) == 1 and merges[0].authorization.via == "github-comment"
    assert s.names("authorize_operator") == []


async def test_merged_by_a_human_outside_the_service_ends_merged_without_merging(time_skipping_env):
    wid, tq = _ids()
    s = Standins(reviews=[review("pending").model_copy(update={"merged": True, "merge_commit": "8" * 40})])
    async with worker(time_skipping_env.client, tq, s):
        rep = await result(await _start(time_skipping_env, tq, wid))
    assert rep.status == "merged" and rep.merge_commit == "8" * 40
    assert s.names("merge_pull_request") == []


async def test_checks_going_red_after_authorization_keep_it_until_green(own_time_skipping_env):
    env = own_time_skipping_env
    wid, tq = _ids()
    s = Standins(reviews=[review("success")])
    async with worker(env.client, tq, s):
        handle = await _start(env, tq, wid)

        async def checks(state: str):
            rep = await _report(handle)
            return rep.review is not None and rep.review.checks == state
        await eventually(lambda: checks("success"), what="green checks")
        s.hold["watch_pull_request"] = release = asyncio.Event()
        await handle.execute_update(BuildPipelineWorkflow.approve_merge, MergeAuthorization(by="ana"))
        s.set_review(review("failure", failing=["ci"]))  # CI went red right after the authorization
        release.set()
        await eventually(lambda: checks("failure"), what="checks red after authorization")
        assert s.names("merge_pull_request") == []
        rep = await _report(handle)
        assert "authorized by ana" in rep.waiting[0].detail and "failing: ci" in rep.waiting[0].detail
        s.set_review(review("success"))  # re-run green: merges on the standing authorization
        rep = await result(handle)
    assert rep.status == "merged" and len(s.names("merge_pull_request")) == 1


async def test_an_approval_sent_the_moment_the_stage_shows_awaiting_merge_is_queued_and_merges(own_time_skipping_env):
    """#37.4: the report offers approve-merge as soon as the stage is ``awaiting_merge``, before the PR watch
    has read the PR once (no review yet). It was refused then ("nothing to merge yet"); now it is accepted,
    bound to the pin commit the report shows, and the merge follows once the first read finds green checks."""
    env = own_time_skipping_env
    wid, tq = _ids()
    s = Standins(reviews=[review("success")])
    s.hold["watch_pull_request"] = release = asyncio.Event()  # the first read has not come back yet
    async with worker(env.client, tq, s):
        handle = await _start(env, tq, wid)

        async def awaiting():
            return await handle.query(BuildPipelineWorkflow.stage) == Stage.AWAITING_MERGE.value
        await eventually(awaiting, what="awaiting_merge")
        assert (await _report(handle)).review is None
        ack = await handle.execute_update(BuildPipelineWorkflow.approve_merge, MergeAuthorization(by="ana"))
        assert f"accepted and queued: the PR's checks are being read; it merges the pin commit {PR_HEAD[:12]}" in ack
        release.set()
        rep = await result(handle)
    assert rep.status == "merged" and "authorized by ana" in rep.message
    assert [(m.head_sha, m.authorization.by, m.authorization.head_sha) for m in s.names("merge_pull_request")] == [
        (PR_HEAD, "ana", PR_HEAD)]
