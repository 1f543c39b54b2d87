"""Every way a pipeline ends (or waits) is recorded by the workflow itself, where operators look:
report status and failure (with next step), BuildStage/BuildFailureClass, memo and the UI's Current
Details. Time-skipping server, real parent and child workflows, stand-in activities."""

from __future__ import annotations

import uuid

import pytest
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError, CancelledError

from domain.models import PipelineInput, PipelineReport, Stage, target_workflow_id
from runtime import operator_client
from runtime import search_attributes as sa
from tests.contract.helpers import COMMIT
from tests.workflows.standins import (
    MANIFEST_MISMATCH,
    UNKNOWN,
    Round,
    Standins,
    eventually,
    request,
    result,
    worker,
)
from workflows.pipeline import BuildPipelineWorkflow
from workflows.target import TargetBuildWorkflow

KEY = "amd64-standard"


def _ids() -> tuple[str, str]:
    u = uuid.uuid4().hex[:8]
    return f"outcome-test-{u}", f"tq-{u}"


async def _start(env, tq: str, wid: str, req=None):
    inp = PipelineInput(request=req or request(), request_id=wid, source_commit=COMMIT)
    return await env.client.start_workflow(BuildPipelineWorkflow.run, inp, id=wid, task_queue=tq)


async def details(handle) -> str:
    """The Markdown the Temporal UI shows as Current Details (answered by the worker)."""
    meta = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    return meta.current_details


async def _attrs(handle) -> tuple[str | None, str | None]:
    found = (await handle.describe()).typed_search_attributes
    return found.get(sa.STAGE), found.get(sa.FAILURE_CLASS)


async def test_a_failed_plan_is_recorded_failed_with_location_and_next_step(time_skipping_env):
    wid, tq = _ids()
    s = Standins()
    s.plan_error = "docker/build_gpu_rl_kaniko.sh:31: unknown architecture 'riscv64' (the script supports amd64, arm64)"
    async with worker(time_skipping_env.client, tq, s):
        handle = await _start(time_skipping_env, tq, wid)
        with pytest.raises(WorkflowFailureError) as info:
            await result(handle)
        rep = await handle.query(BuildPipelineWorkflow.report)
        shown = await details(handle)

    cause = info.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "BuildFailed"
    assert PipelineReport.model_validate(cause.details[0]).status == "failed"  # the report rides on the failure
    assert rep.status == "failed" and rep.failure is not None
    f = rep.failure
    assert (f.failure_class, f.error_type, f.location) == ("input", "InputError", "docker/build_gpu_rl_kaniko.sh:31")
    assert "riscv64" in f.message and "python starter.py build --arch amd64" in f.next_step
    assert "next step" in rep.message
    assert await _attrs(handle) == ("failed", "input")
    assert "stage **failed**" in shown and "**Next step:**" in shown and "docker/build_gpu_rl_kaniko.sh:31" in shown
    memo = await (await handle.describe()).memo_value("summary")
    assert "status failed" in memo and "input:" in memo
    assert s.names("publish_source") == [] and s.names("submit_job") == []

    # The worker is gone: the starter's report reads the failure from history.
    after = await operator_client.read_report(time_skipping_env.client, wid)
    assert after.status == "failed" and after.failure == rep.failure
    assert operator_client.exit_code(after) == 2  # bad input


async def test_a_failed_target_fails_the_pipeline_with_its_class_and_clears_the_good_target(time_skipping_env):
    wid, tq = _ids()
    s = Standins(rounds={"amd64-megatron": [Round(state="failed", evidence=MANIFEST_MISMATCH)]})
    async with worker(time_skipping_env.client, tq, s):
        handle = await _start(time_skipping_env, tq, wid, request(variants=("standard", "megatron")))
        with pytest.raises(WorkflowFailureError):
            await result(handle)
        rep = await handle.query(BuildPipelineWorkflow.report)
        shown = await details(handle)
        bad = time_skipping_env.client.get_workflow_handle(target_workflow_id(wid, "amd64-megatron"))
        bad_status = await bad.query(TargetBuildWorkflow.status)
        bad_shown = await details(bad)
        good = time_skipping_env.client.get_workflow_handle(target_workflow_id(wid, KEY))

    assert rep.status == "failed" and rep.failure and rep.failure.failure_class == "input_error"
    assert rep.failure.error_type == "BuildFailed" and "amd64-megatron: input_error failure" in rep.failure.message
    assert await _attrs(handle) == ("failed", "input_error")
    assert await _attrs(bad) == ("failed", "input_error")
    assert await _attrs(good) == ("done", None)
    assert bad_status.stage == Stage.FAILED and "next step:" in bad_status.message
    assert "| amd64-megatron | failed |" in shown and "| amd64-standard | done |" in shown
    assert "**Next step:**" in shown
    assert "stage **failed**" in bad_shown and "next step:" in bad_shown


async def test_a_waiting_target_makes_the_pipeline_wait_then_cancel_is_recorded(time_skipping_env):
    wid, tq = _ids()
    s = Standins(rounds={KEY: [Round(state="failed", evidence=UNKNOWN)]})
    async with worker(time_skipping_env.client, tq, s):
        handle = await _start(time_skipping_env, tq, wid)

        async def waiting():
            rep = await handle.query(BuildPipelineWorkflow.report)
            return rep if rep.waiting else None
        rep = await eventually(waiting, what="pipeline waiting on its target")
        assert await handle.query(BuildPipelineWorkflow.stage) == "waiting"
        assert (await _attrs(handle))[0] == "waiting"
        w = rep.waiting[0]
        assert (w.kind, w.target, w.command) == ("operator_decision", KEY, f"python starter.py decide {wid} {KEY} retry --by <your-name>")
        shown = await details(handle)
        assert "stage **waiting**" in shown and f"`python starter.py decide {wid} {KEY} retry --by <your-name>`" in shown

        await handle.cancel()
        with pytest.raises(WorkflowFailureError) as info:
            await result(handle)
        assert isinstance(info.value.cause, CancelledError)
        rep = await handle.query(BuildPipelineWorkflow.report)
        shown = await details(handle)
        child = time_skipping_env.client.get_workflow_handle(target_workflow_id(wid, KEY))
        child_status = await child.query(TargetBuildWorkflow.status)

    assert rep.status == "cancelled" and rep.failure and rep.failure.failure_class == "cancelled"
    assert rep.waiting == []
    assert await _attrs(handle) == ("cancelled", "cancelled")
    assert await _attrs(child) == ("cancelled", "cancelled")
    assert child_status.stage == Stage.CANCELLED and "terminated /tester/" in child_status.message
    assert "stage **cancelled**" in shown and "**Cancelled**" in shown

    after = await operator_client.read_report(time_skipping_env.client, wid)  # no worker: from history
    assert after.status == "cancelled" and after.failure and after.failure.failure_class == "cancelled"
    assert "status cancelled" in after.message and operator_client.exit_code(after) == 1
