"""``cancel ID`` cancels the pipeline and terminates its own running Iris job (state KILLED).

The job is made slow (a ``RUN sleep`` step committed to the test's own remote) so the cancel surely
lands while the job runs and the pipeline is monitoring it.
"""

from __future__ import annotations

import subprocess

import pytest
from temporalio.client import WorkflowExecutionStatus

from clients.iris import IrisClient, JobState
from domain.models import target_workflow_id
from sandbox.git_remotes import commit_to_remote
from tests.cli.starter_cli import starter
from tests.e2e.helpers import target_status, wait_until

pytestmark = pytest.mark.stack

KEY = "amd64-standard"
DOCKERFILE = "docker/Dockerfile.gpu-rl"
ANCHOR = 'RUN echo "base: git, curl and ca-certificates present"\n'


def _slow_build(url: str) -> str:
    text = subprocess.run(["git", "--git-dir", url.removeprefix("file://"), "show", f"main:{DOCKERFILE}"],
                          capture_output=True, text=True, check=True).stdout
    assert ANCHOR in text
    return commit_to_remote(url, {DOCKERFILE: text.replace(ANCHOR, ANCHOR + "RUN sleep 120\n")},
                            "test: a slow build step")


async def test_cancel_terminates_the_running_iris_job(service_stack):
    s = service_stack
    _slow_build(s.remotes.marinskyrl_url)
    started = await starter(s.config_path, "build", "--arch", "amd64", "--variant", "standard",
                            "--cluster", "amd64=sandbox-amd64", "--requested-by", "tester", "--reason", "cancel")
    assert started.code == 0, started.text
    wid = started.out.splitlines()[0].removeprefix("workflow: ").split()[0]
    revision = s.config.clusters["sandbox-amd64"].client_revision_date
    async with IrisClient(s.iris.url, client_revision_date=revision) as iris:
        job_id = None
        try:
            status = await wait_until(lambda: _job_running(s.client, wid), what="the Iris job running")
            job_id = status.job_ids[-1]
            cancelled = await starter(s.config_path, "cancel", wid)
            assert cancelled.code == 0 and f"cancellation requested for {wid}" in cancelled.out

            handle = s.client.get_workflow_handle(wid)
            closed = await wait_until(lambda: _closed(handle), what="pipeline closed", timeout=60)
            assert closed == WorkflowExecutionStatus.CANCELED
            state = await wait_until(lambda: _terminal(iris, job_id), what=f"{job_id} terminal", timeout=30)
            assert state == JobState.KILLED
        finally:
            if job_id:
                await iris.terminate(job_id)  # never leave a sleeping task behind
            await _terminate_if_running(s.client, wid)


async def _job_running(client, wid):
    st = await target_status(client, wid, KEY)
    return st if st and st.progress and st.progress.state == "running" and st.job_ids else None


async def _closed(handle):
    status = (await handle.describe()).status
    return status if status != WorkflowExecutionStatus.RUNNING else None


async def _terminal(iris, job_id):
    info = await iris.job_status(job_id, with_tasks=False)
    return info.state if info.state.is_terminal else None


async def _terminate_if_running(client, wid):
    for workflow_id in (wid, target_workflow_id(wid, KEY)):
        try:
            await client.get_workflow_handle(workflow_id).terminate(reason="test cleanup")
        except Exception:  # noqa: BLE001 - already closed
            pass
