"""What operators filter on in the UI: BuildStage/BuildFailureClass/BuildArchitecture/BuildVariant/
BuildSourceCommit, queried through real visibility.

The Java time-skipping server does not implement ListWorkflowExecutions, so these run on the session
dev server (``temporal_client``) with the same stand-in activities; the happy path has no timers, so
real time is a second or two.
"""

from __future__ import annotations

import uuid

import pytest
from temporalio.client import Client, WorkflowFailureError

from domain.models import MergeAuthorization, PipelineInput, PipelineReport
from tests.contract.helpers import COMMIT
from tests.workflows.standins import MANIFEST_MISMATCH, Round, Standins, eventually, request, result, worker
from workflows.pipeline import BuildPipelineWorkflow


async def _ids_matching(client: Client, query: str) -> set[str]:
    return {w.id async for w in client.list_workflows(query)}


async def _visible(client: Client, query: str, expected: set[str]) -> set[str]:
    """Visibility is eventually consistent: wait until every expected id is listed."""
    async def found():
        ids = await _ids_matching(client, query)
        return ids if expected <= ids else None
    return await eventually(found, what=f"{sorted(expected)} listed by {query!r}", attempts=200, interval=0.1)


async def test_finished_build_is_listed_by_stage_commit_architecture_and_variant(temporal_client):
    client = temporal_client
    u = uuid.uuid4().hex[:8]
    wid, tq = f"sa-merged-{u}", f"tq-{u}"
    s = Standins()
    async with worker(client, tq, s):
        handle = await client.start_workflow(
            BuildPipelineWorkflow.run, PipelineInput(request=request(), request_id=wid, source_commit=COMMIT),
            id=wid, task_queue=tq)

        async def green():
            rep = await handle.query(BuildPipelineWorkflow.report)
            return rep.review and rep.review.checks == "success"
        await eventually(green, what="awaiting merge with green checks", attempts=600)
        await handle.execute_update(BuildPipelineWorkflow.approve_merge, MergeAuthorization(by="ana"))
        rep: PipelineReport = await result(handle)
    assert rep.status == "merged"

    child = f"{wid}/amd64-standard"
    await _visible(client, f"BuildStage = 'done' AND BuildSourceCommit = '{COMMIT}'", {wid, child})
    await _visible(client, "BuildArchitecture = 'amd64' AND BuildVariant = 'standard'", {child})
    assert not {wid, child} & await _ids_matching(client, "BuildStage = 'failed'")
    assert child not in await _ids_matching(client, "BuildVariant = 'megatron'")


async def test_failed_target_is_listed_by_failure_class(temporal_client):
    client = temporal_client
    u = uuid.uuid4().hex[:8]
    wid, tq = f"sa-failed-{u}", f"tq-{u}"
    s = Standins(rounds={"amd64-megatron": [Round(state="failed", evidence=MANIFEST_MISMATCH)]})
    async with worker(client, tq, s):
        handle = await client.start_workflow(
            BuildPipelineWorkflow.run,
            PipelineInput(request=request(variants=("standard", "megatron")), request_id=wid, source_commit=COMMIT),
            id=wid, task_queue=tq)
        with pytest.raises(WorkflowFailureError):
            await result(handle)

    bad, good = f"{wid}/amd64-megatron", f"{wid}/amd64-standard"
    # The pipeline carries the class of its failing target; the good target has none.
    listed = await _visible(client, "BuildFailureClass = 'input_error' AND BuildStage = 'failed'", {bad, wid})
    assert good not in listed
    await _visible(client, "BuildStage = 'failed'", {wid, bad})
    await _visible(client, "BuildStage = 'done'", {good})
