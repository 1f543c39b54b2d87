"""BuildPipelineWorkflow on scripted outcomes: plan-only, a failed target blocks recording, and the merge
gate (refusals while checks are pending/red/changes requested, then merge at the reviewed head).
Time-skipping server, real parent and child workflows, stand-in activities."""

from __future__ import annotations

import asyncio
import gc
import logging
import uuid

import pytest
from temporalio.client import WorkflowFailureError, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError

from domain.models import MergeAuthorization, PipelineInput, PipelineReport, Stage
from runtime import search_attributes as sa
from tests.contract.helpers import COMMIT
from tests.workflows.standins import (
    MANIFEST_MISMATCH,
    MERGE_COMMIT,
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


async def test_merge_gate_refuses_until_green_then_merges_the_reviewed_head(own_time_skipping_env, caplog):
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
        assert rep.status == "awaiting_merge" and rep.pull_request and rep.pull_request.number == 7
        assert await handle.query(BuildPipelineWorkflow.stage) == Stage.AWAITING_MERGE.value
        assert "required checks are pending" in await _refused(handle, MergeAuthorization(by="ana"))
        assert "--by" in await _refused(handle, MergeAuthorization(by="  "))

        s.set_review(review("failure", failing=["ci"]))
        await eventually(lambda: review_is("failure"), what="checks red")
        assert "required checks are failure (failing: ci)" in await _refused(handle, MergeAuthorization(by="ana"))

        s.set_review(review("success", changes_requested=True))
        await eventually(lambda: review_is("success", True), what="changes requested")
        assert "requested changes" in await _refused(handle, MergeAuthorization(by="ana"))

        s.set_review(review("success", head=NEW_HEAD))
        rep = await eventually(lambda: review_is("success"), what="checks green")
        assert [(w.kind, w.command) for w in rep.waiting] == [
            ("merge_authorization", f"python starter.py approve-merge {wid} --by <your-name>")]
        assert s.names("merge_pull_request") == []
        s.hold["watch_pull_request"] = release = asyncio.Event()  # keep the post-approval watch in flight
        ack = await handle.execute_update(BuildPipelineWorkflow.approve_merge, MergeAuthorization(by="ana"))
        assert ack == "merge authorized by ana"
        assert "already authorized by ana" in await _refused(handle, MergeAuthorization(by="bob"))
        release.set()
        rep = await result(handle)
        stage = await handle.query(BuildPipelineWorkflow.stage)
        shown = await details(handle)

    assert rep.status == "merged" and rep.merge_commit == MERGE_COMMIT
    # The UI's Current Details of a merged build: the PR, its merge commit and each target's digest.
    digest = rep.targets[0].digest
    assert digest and f"`{digest}`" in shown and "| digest |" in shown, shown
    assert f"**PR** [#7]({rep.pull_request.url}) — merged as `{MERGE_COMMIT}`" in shown, shown
    assert rep.pull_request.merged and rep.pull_request.merge_commit == MERGE_COMMIT
    assert [(m.pr_number, m.head_sha) for m in s.names("merge_pull_request")] == [(7, NEW_HEAD)]
    watches = s.names("watch_pull_request")
    assert watches[-1].last is None  # after authorization the watch returns at once, not on a change
    assert all(w.last is not None for w in watches[1:-1])
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


async def test_merged_by_a_human_outside_the_service_ends_merged_without_merging(time_skipping_env):
    wid, tq = _ids()
    s = Standins(reviews=[review("pending").model_copy(update={"merged": True, "merge_commit": "8" * 40})])
    async with worker(time_skipping_env.client, tq, s):
        rep = await result(await _start(time_skipping_env, tq, wid))
    assert rep.status == "merged" and rep.merge_commit == "8" * 40
    assert s.names("merge_pull_request") == []


async def test_checks_going_red_after_authorization_withdraw_it(own_time_skipping_env):
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
        # The authorization was withdrawn: a new one is needed (and refused while red).
        assert "required checks are failure" in await _refused(handle, MergeAuthorization(by="ana"))
        s.set_review(review("success"))
        await eventually(lambda: checks("success"), what="green again")
        assert s.names("merge_pull_request") == []
        await handle.execute_update(BuildPipelineWorkflow.approve_merge, MergeAuthorization(by="bob"))
        rep = await result(handle)
    assert rep.status == "merged" and len(s.names("merge_pull_request")) == 1

