"""Scheduled rebuild check: start the pipeline only when something that reaches the image changed.

Run by a Temporal Schedule (overlap: skip). The decision and its reasons are the workflow result and its
Current Details in the UI (``report`` and ``schedule describe`` print them); a needed rebuild starts the
pipeline under the dedup id of (source commit, Harbor commit), so a second trigger for the same commits
starts nothing.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import FailureError, WorkflowAlreadyStartedError
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from activities.source import SourceActivities
    from domain import outcome
    from domain.models import (
        PipelineInput,
        RebuildCheckInput,
        RebuildCheckResult,
        RebuildDecision,
        pipeline_id,
    )
    from runtime import search_attributes as sa
    from workflows import options, patches
    from workflows.pipeline import BuildPipelineWorkflow, _error_of


def narrowed_request(request, keys: list[str]):
    """The smallest architecture × variant request covering the variants a crossing change reached."""
    if not keys:
        return request
    archs = [a for a in request.architectures if any(k.startswith(f"{a}-") for k in keys)]
    variants = [v for v in request.variants if any(k.endswith(f"-{v}") for k in keys)]
    if (archs, variants) == (list(request.architectures), list(request.variants)) or not archs or not variants:
        return request
    return request.model_copy(update={"architectures": archs, "variants": variants})


@workflow.defn
class RebuildCheckWorkflow:
    @workflow.run
    async def run(self, inp: RebuildCheckInput) -> RebuildCheckResult:
        # A check started without BuildKind (a schedule created before it existed) tags itself (patched).
        if workflow.info().typed_search_attributes.get(sa.KIND) is None and workflow.patched(patches.BUILD_KIND):
            workflow.upsert_search_attributes([sa.KIND.value_set(sa.BuildKind.REBUILD_CHECK.value)])
        workflow.set_current_details(outcome.rebuild_details_markdown())
        try:
            result = await self._check(inp)
        except FailureError as e:
            error_type, message = _error_of(e)
            workflow.set_current_details(outcome.rebuild_details_markdown(error=f"{error_type}: {message}"))
            raise
        workflow.set_current_details(outcome.rebuild_details_markdown(result))
        return result

    async def _check(self, inp: RebuildCheckInput) -> RebuildCheckResult:
        decision: RebuildDecision = await workflow.execute_activity_method(
            SourceActivities.rebuild_decision, inp, **options.REBUILD_DECISION,
            summary="compare the latest default branches with the last validated image's commits")
        result = RebuildCheckResult(decision=decision)
        if not decision.needed:
            result.note = "no rebuild needed"
            return result
        wid = pipeline_id(decision.source_commit, decision.harbor_commit)
        result.pipeline_workflow_id = wid
        if not inp.start_pipeline:
            result.note = "rebuild needed; not started (start_pipeline=false)"
            return result
        request = inp.request
        if workflow.patched(patches.REBUILD_CANCEL_MEMORY):
            # The same inputs give the same pipeline id: an operator's cancel of it holds until they change.
            cancelled = await workflow.execute_activity_method(
                SourceActivities.earlier_rebuild, wid, **options.REBUILD_DECISION,
                summary=f"was {wid} cancelled by an operator?")
            if cancelled and not inp.force:
                result.held_by_cancel = cancelled
                result.note = (f"rebuild needed, not started: {cancelled}; held until the source or Harbor "
                               "commit changes (or `python starter.py schedule trigger <schedule-id> --force`)")
                return result
            request = narrowed_request(inp.request, decision.rebuild_targets)
        try:
            await workflow.start_child_workflow(
                BuildPipelineWorkflow.run,
                PipelineInput(request=request, request_id=wid, source_commit=decision.source_commit,
                              harbor_commit=decision.harbor_commit),
                id=wid, parent_close_policy=ParentClosePolicy.ABANDON,
                # Built and merged (completed) is never built again; attempted and failed (failed,
                # cancelled, terminated, timed out) is built again as a new run with fresh job names.
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY)
            result.started = True
            result.note = f"started {wid}" + (
                f" for {', '.join(request.architectures)} × {', '.join(request.variants)}"
                if request is not inp.request else "") + (" (--force: an operator's cancel overridden)"
                                                          if inp.force else "")
        except WorkflowAlreadyStartedError:
            result.note = (f"{wid} already exists for these commits (running, or built and merged); "
                           "nothing started")
        return result
