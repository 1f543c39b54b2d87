"""A target whose step (activity) fails for good keeps its job ids and the step's real cause in the
report, the CLI's failure message and the UI (issue #17 item 6: it was ``unknown … Activity task failed``
with ``job_ids: []``). Time-skipping server, real workflows, stand-in activities."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from temporalio.client import WorkflowFailureError

from domain.models import PipelineInput, target_workflow_id
from tests.contract.helpers import COMMIT
from tests.workflows.standins import Round, Standins, request, result, worker
from tests.workflows.test_terminal_outcomes import details
from workflows.pipeline import BuildPipelineWorkflow
from workflows.target import TargetBuildWorkflow

KEY = "amd64-standard"
CAUSE = "Iris FetchLogs: not_found: HTTP 404"


async def test_a_step_error_keeps_job_ids_and_cause(time_skipping_env):
    u = uuid.uuid4().hex[:8]
    wid, tq = f"step-failure-{u}", f"tq-{u}"
    s = Standins(rounds={KEY: [Round(state="succeeded", log_error=("NotFound", CAUSE))]})
    async with worker(time_skipping_env.client, tq, s):
        handle = await time_skipping_env.client.start_workflow(
            BuildPipelineWorkflow.run, PipelineInput(request=request(), request_id=wid, source_commit=COMMIT),
            id=wid, task_queue=tq)
        with pytest.raises(WorkflowFailureError) as info:
            await result(handle)
        rep = await handle.query(BuildPipelineWorkflow.report)
        child = time_skipping_env.client.get_workflow_handle(target_workflow_id(wid, KEY))
        status = await child.query(TargetBuildWorkflow.status)
        shown = await details(child)

    (job_id,) = s.submitted
    (t,) = rep.targets
    assert t.status == "failed" and t.job_ids == [job_id]
    (f,) = t.failures
    assert (f.job_id, f.failure_class, f.decision) == (job_id, "not_found", "fail")
    assert f"step check_build_log failed (NotFound): {CAUSE}" in f.reasons[0]
    assert rep.failure and rep.failure.failure_class == "not_found"
    message = str(info.value.cause)
    assert CAUSE in message and job_id in message and "Activity task failed" not in message
    assert status.job_ids == [job_id] and status.failure_class == "not_found" and CAUSE in status.message
    assert CAUSE in shown and "stage **failed**" in shown


async def test_an_unknown_failure_shows_iris_reason_in_follow_report_and_ui(time_skipping_env):
    """Issue #17 item 7: ``job state killed: Terminated by user`` is shown, not only in diagnostics."""
    from domain.failures import Evidence
    from domain.models import OperatorDecision, PipelineReport, Stage
    from domain.report import report_markdown
    from runtime.progress import rows, wait_lines

    reason = "job state killed: Terminated by user"
    u = uuid.uuid4().hex[:8]
    wid, tq = f"unknown-reason-{u}", f"tq-{u}"
    killed = Evidence(job_state="killed", error="Terminated by user")
    s = Standins(rounds={KEY: [Round(state="killed", evidence=killed)]})
    async with worker(time_skipping_env.client, tq, s):
        handle = await time_skipping_env.client.start_workflow(
            BuildPipelineWorkflow.run, PipelineInput(request=request(), request_id=wid, source_commit=COMMIT),
            id=wid, task_queue=tq)
        child = time_skipping_env.client.get_workflow_handle(target_workflow_id(wid, KEY))
        for _ in range(400):
            try:
                st = await child.query(TargetBuildWorkflow.status)
            except Exception:  # noqa: BLE001 - the child may not have started yet
                st = None
            if st and st.stage == Stage.WAITING:
                break
            await asyncio.sleep(0.05)
        assert st and st.stage == Stage.WAITING and st.failure_class == "unknown"
        follow = "\n".join(wait_lines([st.waiting]))  # what `starter.py follow` prints for the wait
        assert reason in follow
        assert reason in await details(child)  # the Temporal UI's Current Details
        await child.execute_update(TargetBuildWorkflow.decide, OperatorDecision(action="abort", by="ana"))
        with pytest.raises(WorkflowFailureError) as info:
            await result(handle)
        rep = PipelineReport.model_validate(await handle.query(BuildPipelineWorkflow.report))

    assert reason in str(info.value.cause)  # the CLI's failure message
    text = report_markdown(rep)
    assert "unknown → abort" in text and reason in text
    assert rows(rep, {KEY: st})[0].stage == "waiting [unknown]"
