"""The starter's typed view of Temporal: handles by workflow type, reports from history, and service
errors turned into one-line messages with the CLI's exit codes.

Why a module: every ``starter.py`` command needs the same three things (is this id one of our
pipelines or targets, is it still running, what did it end as) and must never print a traceback.
Handles are typed (``get_workflow_handle_for``) and queries/updates/signals are method references,
so a renamed handler breaks here at import, not at an operator's terminal.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime

from temporalio.api.enums.v1 import PendingWorkflowTaskState, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import (
    Client,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
)
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from domain import outcome
from domain.models import FailureInfo, PipelineInput, PipelineReport, RebuildCheckResult, target_workflow_id
from runtime.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE, CommandError  # noqa: F401 - re-exported
from workflows.pipeline import BuildPipelineWorkflow, _error_of
from workflows.rebuild import RebuildCheckWorkflow
from workflows.target import TargetBuildWorkflow


def service_error(e: RPCError, what: str) -> CommandError:
    """Map a Temporal service error to a message naming ``what`` and an exit code."""
    msg = (e.message or str(e)).splitlines()[0][:300]
    if e.status == RPCStatusCode.INVALID_ARGUMENT and "search attribute" in msg.lower():
        msg += ("; the namespace lacks one of the service's search attributes: run "
                "gpu-rl-builder-setup-namespace (deploy/README.md)")
    match e.status:
        case RPCStatusCode.NOT_FOUND:
            return CommandError(f"{what}: not found ({msg})", EXIT_USAGE)
        case RPCStatusCode.ALREADY_EXISTS:
            return CommandError(f"{what}: already exists ({msg})", EXIT_USAGE)
        case RPCStatusCode.INVALID_ARGUMENT | RPCStatusCode.OUT_OF_RANGE:
            return CommandError(f"{what}: refused by Temporal as invalid: {msg}", EXIT_USAGE)
        case RPCStatusCode.FAILED_PRECONDITION:
            return CommandError(f"{what}: {msg}", EXIT_FAILED)
        case RPCStatusCode.UNAVAILABLE | RPCStatusCode.DEADLINE_EXCEEDED:
            return CommandError(f"{what}: Temporal is unreachable ({msg})", EXIT_UNREACHABLE)
        case RPCStatusCode.PERMISSION_DENIED | RPCStatusCode.UNAUTHENTICATED:
            return CommandError(f"{what}: not allowed ({msg}); check the Temporal credentials", EXIT_USAGE)
    return CommandError(f"{what}: {msg}", EXIT_FAILED)


async def describe(client: Client, wid: str) -> WorkflowExecutionDescription:
    try:
        return await client.get_workflow_handle(wid).describe()
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            raise CommandError(f"{wid}: no such workflow in namespace {client.namespace}", EXIT_USAGE) from None
        raise service_error(e, wid) from None


async def _typed(client: Client, wid: str, workflow_type: str, kind: str, *, running: bool) -> None:
    desc = await describe(client, wid)
    if desc.workflow_type != workflow_type:
        raise CommandError(f"{wid} is a {desc.workflow_type} workflow, not a {kind}", EXIT_USAGE)
    if running and desc.status != WorkflowExecutionStatus.RUNNING:
        raise CommandError(f"{wid} has already finished ({desc.status.name.lower()}); nothing to do", EXIT_FAILED)


async def pipeline(client: Client, wid: str, *, running: bool = False) -> WorkflowHandle:
    """A typed handle on one of our build pipelines (refused: unknown id, another workflow type)."""
    await _typed(client, wid, "BuildPipelineWorkflow", "GPU-RL build pipeline", running=running)
    return client.get_workflow_handle_for(BuildPipelineWorkflow.run, wid)


async def target(client: Client, wid: str, key: str, *, running: bool = False) -> WorkflowHandle:
    """A typed handle on one target of a pipeline, addressed as (pipeline id, target key)."""
    await pipeline(client, wid)
    child = target_workflow_id(wid, key)
    try:
        await _typed(client, child, "TargetBuildWorkflow", "build target", running=running)
    except CommandError as e:
        if "no such workflow" in e.message:
            raise CommandError(f"{wid} has no target {key!r} (or it has not started yet)", EXIT_USAGE) from None
        raise
    return client.get_workflow_handle_for(TargetBuildWorkflow.run, child)


async def started_input(client: Client, wid: str) -> PipelineInput:
    """The pipeline's input, read from the first history event (no worker needed)."""
    handle = client.get_workflow_handle(wid)
    try:
        async for event in handle.fetch_history_events(page_size=1):
            payloads = event.workflow_execution_started_event_attributes.input.payloads
            return (await client.data_converter.decode(payloads, [PipelineInput]))[0]
    except RPCError as e:
        raise service_error(e, wid) from None
    raise CommandError(f"{wid}: empty history", EXIT_FAILED)


async def read_report(client: Client, wid: str) -> PipelineReport:
    """The report of a pipeline, running or finished; a finished one is read from its history, so no
    worker has to be running."""
    desc = await describe(client, wid)
    if desc.workflow_type != "BuildPipelineWorkflow":
        raise CommandError(f"{wid} is a {desc.workflow_type} workflow, not a GPU-RL build pipeline", EXIT_USAGE)
    handle = client.get_workflow_handle_for(BuildPipelineWorkflow.run, wid)
    status = desc.status
    if status == WorkflowExecutionStatus.RUNNING:
        try:
            return await handle.query(BuildPipelineWorkflow.report)
        except RPCError as e:
            if e.status in (RPCStatusCode.UNAVAILABLE,):
                raise service_error(e, wid) from None
            inp = await started_input(client, wid)
            return PipelineReport(workflow_id=wid, status="running", request=inp.request,
                                  message=f"no worker answered ({e.message.splitlines()[0][:120]}); "
                                          "showing the request only")
    if status == WorkflowExecutionStatus.COMPLETED:
        return await handle.result()
    if status == WorkflowExecutionStatus.FAILED:
        error_type, message = "Failed", "the workflow failed"
        try:
            await handle.result()
        except WorkflowFailureError as e:
            cause = e.cause
            if isinstance(cause, ApplicationError) and cause.details:
                detail = cause.details[0]
                return detail if isinstance(detail, PipelineReport) else PipelineReport.model_validate(detail)
            error_type, message = type(cause).__name__, str(cause or e)
        inp = await started_input(client, wid)
        info = outcome.step_failure(error_type, message, step="run", request=inp.request,
                                    plan=getattr(inp, "plan_only", False))
        return PipelineReport(workflow_id=wid, status="failed", request=inp.request, failure=info,
                              message=info.message)
    inp = await started_input(client, wid)
    if status == WorkflowExecutionStatus.CANCELED:
        info = outcome.cancelled(inp.request)
    else:  # terminated, timed out
        info = FailureInfo(failure_class=status.name.lower(), error_type=status.name.title(),
                           message=f"the workflow was {status.name.lower().replace('_', ' ')} outside the service",
                           next_step=f"to finish it run `{outcome.resume_command(wid)}` (targets already "
                                     "validated are adopted, the others are built)")
    memo = await desc.memo_value("summary", default="")
    return PipelineReport(workflow_id=wid, status="cancelled" if info.failure_class == "cancelled" else "failed",
                          request=inp.request, failure=info, message=f"{info.message}; last state: {memo}")


def exit_code(rep: PipelineReport) -> int:
    """0 for a build that did what was asked (or is on its way), 2 for bad input, 3 when a service (Iris,
    the registry, GitHub) stayed unreachable for the whole retry budget, 1 otherwise."""
    if rep.status in ("failed", "cancelled"):
        failure_class = rep.failure.failure_class if rep.failure else None
        if failure_class == "unreachable":
            return EXIT_UNREACHABLE
        return EXIT_USAGE if failure_class == "input" else EXIT_FAILED
    return EXIT_OK


# A live worker long-polls, so its poller's last access is at most about a minute old (measured: 5-60 s on
# the dev server); the server keeps a dead worker's poller listed for minutes, ageing past that.
LIVE_POLLER_S = 75.0
# A workflow task scheduled this long without a worker starting it: nobody is polling, whatever the list says.
STALLED_TASK_S = 5.0


async def has_workers(client: Client, task_queue: str) -> bool:
    """Whether a worker polls the workflow task queue: a poller in the server's list whose last access
    is recent (``LIVE_POLLER_S``); a dead worker's poller still listed does not count."""
    try:
        resp = await client.workflow_service.describe_task_queue(DescribeTaskQueueRequest(
            namespace=client.namespace, task_queue=TaskQueue(name=task_queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW))
    except RPCError as e:
        raise service_error(e, f"task queue {task_queue}") from None
    now = time.time()
    return any(not p.HasField("last_access_time") or now - p.last_access_time.ToSeconds() < LIVE_POLLER_S
               for p in resp.pollers)


def stalled_workflow_task(desc: WorkflowExecutionDescription, now: float | None = None) -> float | None:
    """Seconds a workflow task of this running workflow has waited for a worker to start it (None: no
    such wait, or shorter than ``STALLED_TASK_S``). Seen within seconds, unlike a dead poller."""
    pending = desc.raw_description.pending_workflow_task
    if desc.status != WorkflowExecutionStatus.RUNNING or not desc.raw_description.HasField("pending_workflow_task"):
        return None
    if pending.state != PendingWorkflowTaskState.PENDING_WORKFLOW_TASK_STATE_SCHEDULED:
        return None
    waited = (now or time.time()) - pending.original_scheduled_time.ToSeconds()
    return waited if waited >= STALLED_TASK_S else None


def no_worker_line(task_queue: str, why: str) -> str:
    return (f"no worker is polling {task_queue} ({why}); start one (`python worker.py`, or the deployment's "
            "worker) and this carries on by itself")


@dataclass
class RebuildCheckView:
    """A rebuild check as operators read it: how it ended and, once completed, its decision."""

    workflow_id: str
    run_id: str | None
    status: str  # running, completed, failed, canceled, terminated, timed_out
    started_at: datetime | None
    closed_at: datetime | None
    result: RebuildCheckResult | None = None
    error: str = ""

    def line(self) -> str:
        """One line: the decision (completed), or how far it got."""
        if self.result is not None:
            return outcome.rebuild_decision(self.result)
        if self.status == "running":
            return "checking (running)"
        return f"{self.status}" + (f": {self.error}" if self.error else "")

    def as_json(self) -> dict:
        return {"workflow_id": self.workflow_id, "run_id": self.run_id, "status": self.status,
                "started_at": self.started_at.isoformat() if self.started_at else None,
                "closed_at": self.closed_at.isoformat() if self.closed_at else None,
                "decision": self.line(),
                "result": self.result.model_dump(mode="json") if self.result else None, "error": self.error}


async def read_rebuild_check(client: Client, wid: str, run_id: str | None = None) -> RebuildCheckView:
    """A rebuild check's decision, read from its history (no worker needed)."""
    handle = client.get_workflow_handle(wid, run_id=run_id)
    try:
        desc = await handle.describe()
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            raise CommandError(f"{wid}: no such workflow in namespace {client.namespace}", EXIT_USAGE) from None
        raise service_error(e, wid) from None
    if desc.workflow_type != "RebuildCheckWorkflow":
        raise CommandError(f"{wid} is a {desc.workflow_type} workflow, not a rebuild check", EXIT_USAGE)
    view = RebuildCheckView(workflow_id=wid, run_id=desc.run_id, status=desc.status.name.lower(),
                            started_at=desc.start_time, closed_at=desc.close_time)
    if desc.status == WorkflowExecutionStatus.COMPLETED:
        typed = client.get_workflow_handle_for(RebuildCheckWorkflow.run, wid, run_id=desc.run_id)
        view.result = await typed.result(follow_runs=False)
    elif desc.status == WorkflowExecutionStatus.FAILED:
        try:
            await handle.result(follow_runs=False)
        except WorkflowFailureError as e:
            error_type, message = _error_of(e.cause or e)
            view.error = f"{error_type}: {message}"[:500]
    return view
