"""Evidence is found from history alone: across a pipeline's children and its continue-as-new runs.

Tiny stand-in workflows (same activity names and models as the real ones) on the session dev server:
run 1 of a parent starts a target child that captures a failure and checks a log, then continues as
new; ``collect`` still finds every file from the latest run's id, with the worker already gone."""

from __future__ import annotations

import uuid
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.worker import Worker

from domain.failures import Classification, FailureClass
from domain.models import CapturedFailure, CaptureInput, FileRef, LogCheck, LogCheckInput
from runtime.evidence import collect, failed_steps
from tests.workflows.standins import target_input

LOG = FileRef(uri="file:///store/r/job.log", sha256="a" * 64, size_bytes=10)
DIAG = FileRef(uri="file:///store/r/job.diagnostics.json", sha256="b" * 64, size_bytes=20)
BUILD_LOG = FileRef(uri="file:///store/r/job-r1.log", sha256="c" * 64, size_bytes=30)


@activity.defn(name="capture_failure")
async def capture_failure(inp: CaptureInput) -> CapturedFailure:
    c = Classification(failure_class=FailureClass.PREEMPTION, reasons=["k8s: Preempted"], retryable_by_default=True,
                       operator_hint="retry")
    return CapturedFailure(classification=c, diagnostics=DIAG, log=LOG, failing_line="Evicted")


@activity.defn(name="check_build_log")
async def check_build_log(inp: LogCheckInput) -> LogCheck:
    return LogCheck(log=BUILD_LOG, found=[], missing=[], final_push_seen=True, pushed_digest=None)


@workflow.defn(name="EvidenceTargetStandin", sandboxed=False)  # test stand-in; reads fixtures
class Target:
    @workflow.run
    async def run(self, key: str) -> None:
        t = target_input("r").target
        await workflow.execute_activity(capture_failure, CaptureInput(request_id="r", job_id="/u/job", cluster="c",
                                                                      target_key=key),
                                        start_to_close_timeout=timedelta(seconds=30))
        await workflow.execute_activity(check_build_log, LogCheckInput(request_id="r", job_id="/u/job-r1",
                                                                       cluster="c", target=t),
                                        start_to_close_timeout=timedelta(seconds=30))


@workflow.defn(name="EvidencePipelineStandin", sandboxed=False)
class Pipeline:
    @workflow.run
    async def run(self, continued: bool) -> None:
        if not continued:
            await workflow.execute_child_workflow(Target.run, "amd64-standard",
                                                  id=f"{workflow.info().workflow_id}/amd64-standard")
            workflow.continue_as_new(True)


async def test_collect_follows_children_and_continue_as_new_without_a_worker(temporal_client):
    client, tq, wid = temporal_client, f"tq-{uuid.uuid4().hex[:8]}", f"evidence-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=tq, workflows=[Pipeline, Target],
                      activities=[capture_failure, check_build_log]):
        handle = await client.start_workflow(Pipeline.run, False, id=wid, task_queue=tq)
        await handle.result()
    first = [e async for e in client.get_workflow_handle(wid).fetch_history_events()][0]
    assert first.workflow_execution_started_event_attributes.continued_execution_run_id  # really continued

    items = await collect(client, wid)
    assert [(i.target, i.kind, i.job_id, i.ref) for i in items] == [
        ("amd64-standard", "failure log", "/u/job", LOG),
        ("amd64-standard", "diagnostics", "/u/job", DIAG),
        ("amd64-standard", "build log", "/u/job-r1", BUILD_LOG),
    ]
    (step,) = failed_steps(items)
    assert step.ref == LOG and step.failure_class == "preemption" and step.failing_line == "Evicted"
    assert failed_steps(items, "arm64-standard") == []
    # A target workflow id works on its own too.
    assert [i.ref for i in await collect(client, f"{wid}/amd64-standard")] == [LOG, DIAG, BUILD_LOG]
