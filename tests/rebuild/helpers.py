"""Helpers for rebuild-check tests: a pin table naming real commits, and running the check on the stack.

Why a pin commit first: the fixture's pin table names a made-up SOURCE_COMMIT, which the check rightly
treats as "provenance unknown, rebuild". To test the boundary we need the state the service leaves
after a merge: a pin table whose entries name a real source commit and a real Harbor commit.
"""

from __future__ import annotations

import hashlib
import uuid

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode

from domain.models import RebuildCheckInput, RebuildCheckResult
from domain.pins import PinEntry, update_pin_table
from sandbox.git_remotes import commit_to_remote, remote_head
from tests.e2e.helpers import (
    git_show,  # noqa: F401 - re-exported for the rebuild tests
    request,
)
from workflows.rebuild import RebuildCheckWorkflow

ARCHS = ("amd64",)
VARIANTS = ("standard",)


def _tag(arch: str, variant: str, sha: str) -> str:
    prefix = "gpu-rl-megatron" if variant == "megatron" else "gpu-rl"
    return f"{prefix}-{sha}" + ("-arm64" if arch == "arm64" else "")


def pin_current_head(stack, *, harbor_commit: str, harbor_by_variant: dict[str, str] | None = None,
                     variants: tuple[str, ...] = ("standard", "megatron")) -> str:
    """Commit a pin table whose every entry names the current head and ``harbor_commit``; return that head.

    This is what a merged record PR leaves behind: the pinned images were built from ``head``, and the
    commit after it changes only the pin table (under ``cloud/iris/``). ``harbor_by_variant`` overrides
    the Harbor commit per variant (a table whose entries disagree); ``variants``: pin only these (an
    operator's standard-only build leaves the others at their earlier pins).
    """
    harbor_by_variant = harbor_by_variant or {}
    url, path = stack.config.repos.marinskyrl_url, stack.config.github.pin_table_path
    head = remote_head(url)
    entries = [PinEntry(architecture=a, variant=v, tag=_tag(a, v, head), source_commit=head,
                        harbor_commit=harbor_by_variant.get(v, harbor_commit),
                        digest="sha256:" + hashlib.sha256(f"{a}/{v}/{head}".encode()).hexdigest())
               for a in ("amd64", "arm64") for v in variants]
    text = update_pin_table(git_show(url, "main", path), entries, path=path)
    commit_to_remote(url, {path: text}, f"Pin GPU-RL images built from {head[:12]}")
    return head


def check_input(*, start_pipeline: bool, variants=VARIANTS, force: bool = False, **request_kw) -> RebuildCheckInput:
    return RebuildCheckInput(request=request(ARCHS, variants, **request_kw), start_pipeline=start_pipeline,
                             force=force)


async def run_check(stack, *, start_pipeline: bool, **input_kw) -> RebuildCheckResult:
    return await stack.client.execute_workflow(
        RebuildCheckWorkflow.run, check_input(start_pipeline=start_pipeline, **input_kw),
        id=f"rebuild-check-test-{uuid.uuid4().hex[:10]}", task_queue=stack.task_queue,
        result_type=RebuildCheckResult)


async def workflow_exists(client: Client, wid: str) -> bool:
    try:
        await client.get_workflow_handle(wid).describe()
        return True
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            return False
        raise


async def pipelines_on_queue(client: Client, task_queue: str) -> list[str]:
    """Ids of every BuildPipelineWorkflow execution on this (test-unique) task queue, any status."""
    query = f"TaskQueue = '{task_queue}' AND WorkflowType = 'BuildPipelineWorkflow'"
    return [w.id async for w in client.list_workflows(query)]


async def stop_pipeline(handle: WorkflowHandle) -> None:
    """Terminate a started pipeline (its targets are cancelled with it) to keep the suite fast."""
    try:
        running = (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            return  # never started (the test failed before): nothing to stop
        raise
    if running:
        await handle.terminate(reason="rebuild-check test: the started pipeline is not under test")
