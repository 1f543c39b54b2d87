"""Cancelling a build stops exactly the Iris jobs it submitted, wherever the target was when cancelled."""

from __future__ import annotations

import uuid

import pytest
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError
from temporalio.exceptions import CancelledError

from domain.models import PipelineInput, Stage, target_workflow_id
from tests.contract.helpers import COMMIT
from tests.workflows.standins import (
    UNKNOWN,
    Round,
    Standins,
    eventually,
    request,
    result,
    target_input,
    worker,
)
from workflows.pipeline import BuildPipelineWorkflow
from workflows.target import TargetBuildWorkflow

KEY = "amd64-standard"


def _ids() -> tuple[str, str]:
    u = uuid.uuid4().hex[:8]
    return f"cancel-test-{u}", f"tq-{u}"


async def _stage_is(handle, stage: Stage):
    return (await handle.query(TargetBuildWorkflow.status)).stage == stage


async def _cancelled(handle) -> None:
    with pytest.raises(WorkflowFailureError) as info:
        await result(handle)
    assert isinstance(info.value.cause, CancelledError), info.value.cause


async def test_cancel_while_waiting_for_an_operator_terminates_the_submitted_job(time_skipping_env):
    wid, tq = _ids()
    s = Standins(rounds={KEY: [Round(state="failed", evidence=UNKNOWN)]})
    async with worker(time_skipping_env.client, tq, s):
        handle = await time_skipping_env.client.start_workflow(TargetBuildWorkflow.run, target_input(wid),
                                                               id=wid, task_queue=tq)
        await eventually(lambda: _stage_is(handle, Stage.WAITING), what="waiting for operator")
        await handle.cancel()
        await _cancelled(handle)
        status = await handle.query(TargetBuildWorkflow.status)

    assert [t.job_ids for t in s.names("terminate_jobs")] == [s.submitted]
    assert status.stage == Stage.CANCELLED and status.failure_class == "cancelled"


async def test_cancel_while_monitoring_terminates_the_running_job(own_time_skipping_env):
    """The target sleeps until the cluster watcher wakes it; a cancel in that sleep stops its own job."""
    time_skipping_env = own_time_skipping_env
    wid, tq = _ids()
    s = Standins(rounds={KEY: [Round(pending_for_s=3 * 86400)]})
    async with worker(time_skipping_env.client, tq, s):
        handle = await time_skipping_env.client.start_workflow(TargetBuildWorkflow.run, target_input(wid),
                                                               id=wid, task_queue=tq)
        await eventually(lambda: _monitoring(handle), what="monitoring")
        await handle.cancel()
        await _cancelled(handle)
    assert [t.job_ids for t in s.names("terminate_jobs")] == [s.submitted]


async def _monitoring(handle) -> bool:
    st = await handle.query(TargetBuildWorkflow.status)
    return st.stage == Stage.RUNNING and st.progress is not None and st.progress.state == "pending"


async def test_cancelling_the_pipeline_cancels_its_targets_which_terminate_their_jobs(time_skipping_env):
    wid, tq = _ids()
    s = Standins(rounds={KEY: [Round(state="failed", evidence=UNKNOWN)]})
    async with worker(time_skipping_env.client, tq, s):
        handle = await time_skipping_env.client.start_workflow(
            BuildPipelineWorkflow.run, PipelineInput(request=request(), request_id=wid, source_commit=COMMIT),
            id=wid, task_queue=tq)
        child = time_skipping_env.client.get_workflow_handle(target_workflow_id(wid, KEY))
        await eventually(lambda: _child_waiting(child), what="target waiting for operator")
        await handle.cancel()
        # No time skipping while the cancel travels: the parent's request reaches the child through the server
        # after the parent's task completes, and in that gap the test server may skip time to the child's
        # operator-wait timeout, so the child fails as unanswered before it sees the cancel (a full-suite run
        # failed so: TargetFailed instead of CancelledError). Nothing here needs a timer to fire.
        with time_skipping_env.auto_time_skipping_disabled():
            await _cancelled(handle)
            await _cancelled(child)

    assert (await handle.describe()).status == WorkflowExecutionStatus.CANCELED

    assert len(s.names("terminate_jobs")) == 1
    assert s.names("record_artifact") == []


async def _child_waiting(child) -> bool:
    try:
        return await _stage_is(child, Stage.WAITING)
    except Exception:  # noqa: BLE001 - not started yet
        return False


async def _closed(handle) -> bool:
    return (await handle.describe()).status != WorkflowExecutionStatus.RUNNING


async def _entered(s: Standins, name: str) -> bool:
    ev = s.entered.get(name)
    return bool(ev and ev.is_set())


async def test_a_new_run_after_a_cancel_submits_a_fresh_job_instead_of_attaching(own_time_skipping_env):
    """Cancel → new build: the same target id in a new run gets its own job name (request generation),
    so it never attaches to the job the cancelled run terminated."""
    time_skipping_env = own_time_skipping_env
    wid, tq = _ids()
    s = Standins(rounds={KEY: [Round(state="failed", evidence=UNKNOWN)]})
    async with worker(time_skipping_env.client, tq, s):
        first = await time_skipping_env.client.start_workflow(TargetBuildWorkflow.run, target_input(wid),
                                                              id=wid, task_queue=tq)
        await eventually(lambda: _stage_is(first, Stage.WAITING), what="first run waiting for operator")
        await first.cancel()
        await _cancelled(first)
        s.rounds[KEY] = [Round()]
        second = await time_skipping_env.client.start_workflow(TargetBuildWorkflow.run, target_input(wid),
                                                               id=wid, task_queue=tq)
        res = await result(second)

    terminated = [j for t in s.names("terminate_jobs") for j in t.job_ids]
    assert len(s.submitted) == 2 and terminated == s.submitted[:1]
    assert res.status == "validated" and res.job_ids == s.submitted[1:]
    assert s.submitted[1] != s.submitted[0]  # fresh job: never the one the cancelled run terminated
    assert [i.round for i in s.names("submit_job")] == [0, 0]
