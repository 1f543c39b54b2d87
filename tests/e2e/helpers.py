"""Small helpers for end-to-end tests: start a pipeline like the starter does, and play the operator."""

from __future__ import annotations

import asyncio
import subprocess
import time

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.common import WorkflowIDConflictPolicy

from domain.buildset import BuildRequest, CompatibilityRequest
from domain.models import PipelineInput, PipelineReport, TargetStatus, pipeline_id, target_workflow_id
from rehearsal.model import PLACEHOLDER, other_placeholder
from starter import ls_remote_head
from workflows.pipeline import BuildPipelineWorkflow
from workflows.target import TargetBuildWorkflow


def in_the_real_job_only(snippet: str) -> str:
    """``snippet`` guarded so it runs in the Iris job but not in the pre-submission rehearsal.

    The rehearsal (rehearsal/model.py) runs the planned command with credentials as placeholders, and
    refuses a build whose script fails there, so a test that needs a *job* to misbehave (print its token,
    then fail) must keep the rehearsal on the good path: the guard is the placeholder value itself, in both
    of the rehearsal's runs (rehearsal/runner.py ``_run_twice``: the second with every placeholder's letters
    and digits changed, ``other_placeholder``). Guarding the first form only, the second run took the
    snippet: a ``held_until`` in it waited out its whole bound (60 s of every plan of
    test_redaction_after_crash_e2e) and the runs' verdicts differed."""
    prefix = PLACEHOLDER.split("{", 1)[0]
    return (f'case "${{GHCR_TOKEN:-}}" in {prefix}*|{other_placeholder(prefix)}*) ;; *)\n{snippet.rstrip()}\n'
            ';; esac\n')


def held_until(release, bound_s: int = 60) -> str:
    """Shell for a job step that lasts until the test creates the file ``release`` (at most ``bound_s``).

    Why: a test that must stop or kill a worker while the job runs holds the job exactly as long as that
    takes, where a fixed ``sleep`` either wastes its remainder or runs out on a slow machine."""
    return f'for i in $(seq {bound_s * 10}); do [ -e "{release}" ] && break; sleep 0.1; done'


async def worker_started(log) -> bool:
    """The worker process writing ``log`` has connected and is about to poll (its "worker started" line)."""
    return log.exists() and "worker started" in log.read_text(errors="replace")


def request(archs=("amd64",), variants=("standard",), **kw) -> BuildRequest:
    return BuildRequest(architectures=list(archs), variants=list(variants),
                        compatibility_request=CompatibilityRequest(requested_by="tester", reason="e2e test"),
                        clusters={a: f"sandbox-{a}" for a in archs}, **kw)


async def start_pipeline(stack, req: BuildRequest, *, plan_only: bool = False):
    src = ls_remote_head(stack.config.repos.marinskyrl_url)
    harbor = ls_remote_head(stack.config.repos.harbor_url, req.harbor_ref)
    wid = pipeline_id(src, harbor) + ("-plan" if plan_only else "")
    handle = await stack.client.start_workflow(
        BuildPipelineWorkflow.run,
        PipelineInput(request=req, request_id=wid, plan_only=plan_only, source_commit=src, harbor_commit=harbor),
        id=wid, task_queue=stack.task_queue, id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING)
    return handle


async def target_status(client: Client, wid: str, key: str) -> TargetStatus | None:
    try:
        return await client.get_workflow_handle(target_workflow_id(wid, key)).query(TargetBuildWorkflow.status)
    except Exception:  # noqa: BLE001 - the child may not exist yet
        return None


async def report(client: Client, wid: str) -> PipelineReport:
    return await client.get_workflow_handle(wid).query(BuildPipelineWorkflow.report)


async def wait_until(predicate, timeout: float = 240.0, interval: float = 0.5, what: str = "condition"):
    """Poll an async predicate until it returns a truthy value (bounded; never a timed assertion)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await predicate()
        if value:
            return value
        await asyncio.sleep(interval)
    raise AssertionError(f"gave up waiting for {what} after {timeout:.0f}s")


async def is_closed(client: Client, wid: str) -> bool:
    return (await client.get_workflow_handle(wid).describe()).status != WorkflowExecutionStatus.RUNNING


# -- what e2e tests wait for (predicates for wait_until: a value when reached, None/False before) --


async def waiting_on_visibility(client: Client, wid: str, key: str) -> TargetStatus | None:
    """The target waits for its package to become public; a target that failed instead fails the test."""
    st = await target_status(client, wid, key)
    assert st is None or st.stage.value != "failed", f"{key} failed: {st.model_dump_json()}"
    return st if st and st.waiting and st.waiting.kind == "package_visibility" else None


async def awaiting_merge(client: Client, wid: str) -> PipelineReport | None:
    """The PR is open and its review state was read: the pipeline waits for CI or an operator."""
    rep = await report(client, wid)
    return rep if rep.status == "awaiting_merge" and rep.pull_request and rep.review else None


async def checks_green(client: Client, wid: str) -> bool:
    rep = await report(client, wid)
    return rep.review is not None and rep.review.checks == "success"


def git_show(url: str, rev: str, path: str) -> str:
    """A file as a bare remote holds it at ``rev`` (read straight from the remote, not a mirror)."""
    return subprocess.run(["git", "--git-dir", url.removeprefix("file://"), "show", f"{rev}:{path}"],
                          capture_output=True, text=True, check=True).stdout


def worker_process(config_path, log_path, *extra: str, script: str = "worker.py") -> subprocess.Popen:
    """A real worker process (own session, so a test can stop it and everything it started)."""
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    return subprocess.Popen([sys.executable, str(root / script), "--config", str(config_path),
                             "--graceful-shutdown", "5", *extra], cwd=root, stdout=open(log_path, "w"),  # noqa: SIM115
                            stderr=subprocess.STDOUT, start_new_session=True)


def stop_process(proc: subprocess.Popen | None, timeout: float = 60.0) -> int | None:
    """SIGTERM, wait, then SIGKILL the process group if it is still there; returns the exit code."""
    import os
    import signal

    if proc is None:
        return None
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    return proc.returncode
