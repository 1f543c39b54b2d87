"""Upgrades without breaking running builds (docs/versioning.md): a build started on worker version A
is finished by version B, whose target workflow changed (the patched evidence memo).

Real processes: version A (tests/versioning/worker_a.py: the release before the patch) starts the
build and is stopped while it monitors the Iris job; version B (today's worker.py) replays A's part of
the history, applies the new code only from there on (a patch marker, then the memo), and the build
goes on to a merged PR with exactly one Iris job."""

from __future__ import annotations

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from clients.iris import IrisClient
from domain.models import MergeAuthorization, PipelineReport, target_workflow_id
from sandbox.git_remotes import commit_to_remote
from sandbox.stack import MARINSKYRL_SLUG
from tests.e2e.helpers import (
    awaiting_merge,
    checks_green,
    git_show,
    held_until,
    request,
    start_pipeline,
    stop_process,
    target_status,
    wait_until,
    waiting_on_visibility,
    worker_started,
)
from tests.e2e.helpers import worker_process as worker
from workflows import patches
from workflows.pipeline import BuildPipelineWorkflow
from workflows.target import TargetBuildWorkflow

pytestmark = pytest.mark.stack
KEY = "amd64-standard"


async def test_a_build_started_on_version_a_finishes_on_version_b(service_config):
    s = service_config
    dockerfile = git_show(s.remotes.marinskyrl_url, "main", "docker/Dockerfile.gpu-rl")
    # The job holds at this step until the test releases it once B runs (bounded: 60 s), so A stops and B
    # starts while the job is still running, without a fixed sleep.
    release = s.state_dir / "release-the-build-step"
    hold = f"RUN {held_until(release)}\n"
    slow = dockerfile.replace('RUN echo "boto3 s3 client ctor OK', hold + 'RUN echo "boto3 s3 client ctor OK', 1)
    assert slow != dockerfile
    commit_to_remote(s.remotes.marinskyrl_url, {"docker/Dockerfile.gpu-rl": slow}, "a slow build step")
    a = worker(s.config_path, s.state_dir / "worker-a.log", script="tests/versioning/worker_a.py")
    b = None
    try:
        handle = await start_pipeline(s, request())
        wid = handle.id
        st = await wait_until(lambda: _monitoring(s.client, wid), what="version A monitoring the job")
        assert stop_process(a) == 0  # a rolling deploy: SIGTERM, drain, exit
        b = worker(s.config_path, s.state_dir / "worker-b.log")
        await wait_until(lambda: worker_started(s.state_dir / "worker-b.log"), what="version B polling")
        release.touch()
        await wait_until(lambda: waiting_on_visibility(s.client, wid, KEY), timeout=300, what="visibility wait on B")
        s.token_registry.set_public(s.image_repo_path, True)
        await s.client.get_workflow_handle(target_workflow_id(wid, KEY)).signal(TargetBuildWorkflow.recheck)
        rep = await wait_until(lambda: awaiting_merge(s.client, wid), timeout=300, what="PR opened")
        s.github.set_check(MARINSKYRL_SLUG, rep.pull_request.head_sha, "ci")
        await wait_until(lambda: checks_green(s.client, wid), what="checks green")
        await handle.execute_update(BuildPipelineWorkflow.approve_merge, MergeAuthorization(by="tester"))
        final: PipelineReport = await handle.result()
        child = s.client.get_workflow_handle(target_workflow_id(wid, KEY))
        history = await child.fetch_history()
        memo = await (await child.describe()).memo_value("evidence", type_hint=dict)
    finally:
        assert stop_process(b) in (0, None)
        stop_process(a)

    (t,) = final.targets
    assert final.status == "merged" and t.status == "validated" and t.job_ids == st.job_ids
    async with IrisClient(s.iris.url, client_revision_date=s.config.clusters["sandbox-amd64"].client_revision_date) as iris:
        assert [j.job_id for j in await iris.list_jobs(prefix=t.job_ids[0])] == t.job_ids  # B attached, no resubmit

    # A ran the start of the target workflow, B the rest; B's new code starts after A's part, behind the patch.
    deciders = [e.workflow_task_completed_event_attributes.identity.rsplit(":", 1)[-1] for e in history.events
                if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED]
    assert deciders[0] == str(a.pid) and deciders[-1] == str(b.pid)
    markers = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
               and patches.EVIDENCE_MEMO.encode() in e.SerializeToString()]  # A and B share the other patches
    assert len(markers) == 1
    first_b = next(e.event_id for e in history.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
                   and e.workflow_task_completed_event_attributes.identity.endswith(f":{b.pid}"))
    assert markers[0].event_id > first_b
    log = t.log_check.log
    assert memo == {f"{t.job_ids[0]} build log": f"{log.uri} (sha256 {log.sha256})"}

    # And the mixed history replays against today's code, as the next deploy will.
    replayed = await Replayer(workflows=[BuildPipelineWorkflow, TargetBuildWorkflow],
                              data_converter=pydantic_data_converter).replay_workflow(history,
                                                                                      raise_on_replay_failure=False)
    assert replayed.replay_failure is None, replayed.replay_failure
    log_a = (s.state_dir / "worker-a.log").read_text()
    assert "worker started" in log_a and "Traceback" not in log_a, log_a[-3000:]


async def _monitoring(client, wid):
    st = await target_status(client, wid, KEY)
    return st if st and st.progress and st.progress.state == "running" else None
