"""Safe re-runs on real parts: a new run never re-attaches to a job an earlier run terminated, and a
run that failed while recording is finished by the next run, which adopts the validated image (no new
job) and reuses the pin commit it pushed."""

from __future__ import annotations

import subprocess

import pytest
from temporalio.client import WorkflowExecutionStatus

from clients.git_source import build_request_of
from clients.iris import IrisClient, JobState
from domain.models import MergeAuthorization, PipelineReport
from sandbox.git_remotes import commit_to_remote
from sandbox.stack import MARINSKYRL_SLUG
from tests.e2e.helpers import git_show, report, request, start_pipeline, target_status, wait_until

pytestmark = pytest.mark.stack
KEY = "amd64-standard"


def _git(url: str, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", url.removeprefix("file://"), *args], capture_output=True, text=True,
                          check=True).stdout


def _branch_log(url: str, branch: str) -> list[tuple[str, str | None]]:
    """(sha, Build-Request trailer) of the commits on ``branch`` not on main, newest first."""
    shas = _git(url, "rev-list", f"main..refs/heads/{branch}").split()
    return [(sha, build_request_of(_git(url, "log", "-1", "--format=%B", sha))) for sha in shas]


async def _iris(s):
    return IrisClient(s.iris.url, client_revision_date=s.config.clusters["sandbox-amd64"].client_revision_date)


async def _pins_pushed(s, branch: str, wid: str):
    try:
        log = _branch_log(s.remotes.marinskyrl_url, branch)
    except subprocess.CalledProcessError:
        return None  # branch not pushed yet
    return log if log and log[0][1] == f"{wid}-pins" else None


async def test_failure_in_recording_then_a_rerun_reuses_the_pin_commit_and_merges(service_stack):
    s = service_stack
    s.token_registry.set_public(s.image_repo_path, True)  # no visibility wait
    first = await start_pipeline(s, request(issue_url="#9"))
    wid = first.id
    branch = f"{s.config.repos.build_branch_prefix}{wid}"
    pushed = await wait_until(lambda: _pins_pushed(s, branch, wid), timeout=300, what="pin commit pushed")
    assert [t for _, t in pushed] == [f"{wid}-pins", wid]
    first_jobs = (await target_status(s.client, wid, KEY)).job_ids
    first_run = (await first.describe()).run_id
    # The run dies while recording (after the pin commit was pushed): it failed, nothing merged.
    await first.terminate(reason="test: a failure in recording")

    second = await start_pipeline(s, request(issue_url="#9"))
    assert second.id == wid and (await second.describe()).run_id != first_run
    rep = await wait_until(lambda: _awaiting_merge(s, wid), timeout=300, what="re-run awaiting merge")
    s.github.set_check(MARINSKYRL_SLUG, rep.pull_request.head_sha, "ci")
    await wait_until(lambda: _green(s, wid), what="checks green")
    await second.execute_update("approve_merge", MergeAuthorization(by="tester"), result_type=str)
    final: PipelineReport = await second.result()

    assert final.status == "merged"
    assert final.pull_request.pin_commit == pushed[0][0]  # the pushed pin commit, reused
    # The branch never moved past it: one build commit, one pin commit for the request.
    assert _git(s.remotes.marinskyrl_url, "rev-parse", f"refs/heads/{branch}").strip() == pushed[0][0]
    assert git_show(s.remotes.marinskyrl_url, "main", "cloud/iris/gpu_rl_images.py").count(final.targets[0].digest)
    (t,) = final.targets
    # The first run had validated the image (it died while recording): the re-run adopted it, no new job.
    assert t.adopted_from and t.job_ids == first_jobs


async def test_cancel_then_a_new_build_gets_a_fresh_iris_job(service_stack):
    s = service_stack
    dockerfile = git_show(s.remotes.marinskyrl_url, "main", "docker/Dockerfile.gpu-rl")
    slow = dockerfile.replace('RUN echo "boto3 s3 client ctor OK', 'RUN sleep 20\nRUN echo "boto3 s3 client ctor OK', 1)
    commit_to_remote(s.remotes.marinskyrl_url, {"docker/Dockerfile.gpu-rl": slow}, "a slow build step")
    first = await start_pipeline(s, request())
    running = await wait_until(lambda: _job_running(s, first.id), timeout=300, what="first job running")
    (killed,) = running.job_ids
    await first.cancel()
    await wait_until(lambda: _closed(first), what="first run cancelled")
    async with await _iris(s) as iris:
        assert (await iris.job_status(killed, with_tasks=False)).state in (JobState.KILLED, JobState.FAILED)

    second = await start_pipeline(s, request())
    assert second.id == first.id
    again = await wait_until(lambda: _job_running(s, second.id, not_in={killed}), timeout=300,
                             what="the new run's own job")
    (fresh,) = again.job_ids
    assert fresh != killed
    async with await _iris(s) as iris:
        assert (await iris.job_status(fresh, with_tasks=False)).state in (JobState.PENDING, JobState.RUNNING,
                                                                          JobState.SUCCEEDED)
    await second.cancel()
    await wait_until(lambda: _closed(second), what="second run cancelled")


async def _job_running(s, wid: str, not_in: set[str] = frozenset()):
    st = await target_status(s.client, wid, KEY)
    return st if st and st.job_ids and not set(st.job_ids) & not_in and st.progress and \
        st.progress.job_id not in not_in and st.progress.state == "running" else None


async def _closed(handle) -> bool:
    return (await handle.describe()).status != WorkflowExecutionStatus.RUNNING


async def _awaiting_merge(s, wid: str):
    rep = await report(s.client, wid)
    return rep if rep.pull_request and rep.status == "awaiting_merge" else None


async def _green(s, wid: str):
    rep = await report(s.client, wid)
    return rep.review is not None and rep.review.checks == "success"
