"""Resume, don't rebuild, on real parts with a builder that is NOT reproducible.

The kaniko stand-in is told (``KANIKO_STANDIN_REPRODUCIBLE=0`` in the jobs' env, like real kaniko
without ``--reproducible``) to stamp the build time into every image, so any rebuild would push a new
digest and could never match the pin commit already pushed. Recording fails after validation (the
issue to comment on disappears: a final 404); the failure's next step is the resume command, and that
command — run by the operator CLI — finishes the build with 0 new Iris jobs, 1 pin commit and 1 PR.
"""

from __future__ import annotations

import shlex
import subprocess

import httpx
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError

from clients.iris import IrisClient
from domain.models import MergeAuthorization, PipelineReport, TargetResult, target_workflow_id
from sandbox.stack import MARINSKYRL_SLUG
from tests.cli.starter_cli import starter
from tests.e2e.helpers import awaiting_merge, checks_green, request, start_pipeline, target_status, wait_until
from worker import build_worker

pytestmark = pytest.mark.stack
KEY = "amd64-standard"
ISSUE = 9


def _non_reproducible(config):
    clusters = {name: c.model_copy(update={"job_env": {**c.job_env, "KANIKO_STANDIN_REPRODUCIBLE": "0"}})
                for name, c in config.clusters.items()}
    return config.model_copy(update={"clusters": clusters})


async def _iris_jobs(s, sha: str) -> list[str]:
    async with IrisClient(s.iris.url, client_revision_date=s.config.clusters["sandbox-amd64"].client_revision_date) \
            as iris:
        return sorted(j.job_id for j in await iris.list_jobs(prefix="/gpu-rl-builder/") if sha[:8] in j.job_id)


def _trailers(url: str) -> list[str]:
    return subprocess.run(["git", "--git-dir", url.removeprefix("file://"), "log", "--all",
                           "--format=%(trailers:key=Build-Request,valueonly)"],
                          capture_output=True, text=True, check=True).stdout.split()


async def test_a_failure_in_recording_is_finished_by_the_suggested_command_without_rebuilding(service_config):
    s = service_config
    s.token_registry.set_public(s.image_repo_path, True)  # no visibility wait
    async with build_worker(s.client, _non_reproducible(s.config), graceful_shutdown_s=5):
        first = await start_pipeline(s, request(issue_url=f"#{ISSUE}"))
        wid = first.id
        # Once the target runs (preflight has proven the issue exists) the issue goes away: the comment,
        # the last step of recording, is refused with a final 404.
        await wait_until(lambda: target_status(s.client, wid, KEY), timeout=300, what="target started")
        s.github.set_issue(MARINSKYRL_SLUG, ISSUE, missing=True)
        with pytest.raises(WorkflowFailureError):
            await first.result()
        failed: PipelineReport = await _report_of(s, wid)
        st = await target_status(s.client, wid, KEY)
        assert st.validation_ok and failed.status == "failed"
        assert failed.failure.error_type == "NotFound" and "recording" in failed.failure.message
        next_step = failed.failure.next_step
        assert f"python starter.py resume {wid}" in next_step and "starter.py build" not in next_step
        first_jobs = st.job_ids
        build_sha = failed.source.build_commit
        jobs_before = await _iris_jobs(s, build_sha)
        assert jobs_before == sorted(first_jobs) and len(first_jobs) == 1
        child_handle = s.client.get_workflow_handle(target_workflow_id(wid, KEY), result_type=TargetResult)
        digest = (await child_handle.result()).digest
        child_run = (await child_handle.describe()).run_id

        # The operator fixes the cause and runs the command the failure suggested, as written.
        s.github.set_issue(MARINSKYRL_SLUG, ISSUE, missing=False)
        command = next_step.split("`")[1]
        ran = await starter(s.config_path, *shlex.split(command)[2:])
        assert ran.code == 0, ran.text
        assert "resumed" in ran.out
        rep = await wait_until(lambda: awaiting_merge(s.client, wid), timeout=300, what="resumed run awaiting merge")
        s.github.set_check(MARINSKYRL_SLUG, rep.pull_request.head_sha, "ci")
        await wait_until(lambda: checks_green(s.client, wid), what="checks green")
        handle = s.client.get_workflow_handle(wid, result_type=PipelineReport)
        await handle.execute_update("approve_merge", MergeAuthorization(by="tester"), result_type=str)
        final: PipelineReport = await handle.result()

    assert final.status == "merged"
    (t,) = final.targets
    assert t.adopted_from and t.job_ids == first_jobs and t.digest == digest
    # 0 new Iris jobs: the cluster has only the first run's job for this build commit, and the resumed run
    # neither submitted nor started a target workflow.
    assert await _iris_jobs(s, build_sha) == jobs_before
    history = await handle.fetch_history()
    kinds = {e.event_type for e in history.events}
    assert EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED not in kinds
    child = await s.client.get_workflow_handle(target_workflow_id(wid, KEY)).describe()
    assert child.status == WorkflowExecutionStatus.COMPLETED and child.run_id == child_run
    # 1 pin commit and 1 build commit for the request; the pin table names the first (only) digest.
    trailers = _trailers(s.remotes.marinskyrl_url)
    assert trailers.count(wid) == 1 and trailers.count(f"{wid}-pins") == 1, trailers
    assert final.pull_request.pin_commit and digest in subprocess.run(
        ["git", "--git-dir", s.remotes.marinskyrl_url.removeprefix("file://"), "show", "main:cloud/iris/gpu_rl_images.py"],
        capture_output=True, text=True, check=True).stdout
    # 1 PR, and the one comment posted once the issue was back.
    auth = {"Authorization": f"token {s.github.token}"}
    async with httpx.AsyncClient(base_url=s.github.api_url, headers=auth) as gh:
        pulls = (await gh.get(f"/repos/{MARINSKYRL_SLUG}/pulls", params={"state": "all"})).json()
        comments = (await gh.get(f"/repos/{MARINSKYRL_SLUG}/issues/{ISSUE}/comments")).json()
    assert [p["number"] for p in pulls if p["head"]["ref"] == final.source.branch] == [final.pull_request.number]
    assert len(comments) == 1
    text = (await starter(s.config_path, "report", wid)).out
    assert "adopted" in text.lower() and KEY in text


async def _report_of(s, wid: str) -> PipelineReport:
    from runtime import operator_client as oc

    return await oc.read_report(s.client, wid)
