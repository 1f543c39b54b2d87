"""Two worker processes, one sandbox Temporal, one four-target build: every side effect happens once.

Both workers poll the same task queue, so the pipeline's activities and the four target workflows are
spread over two processes (the test checks that both ran activities). Idempotence must hold across
them: one Iris job per target, one build commit and one pin commit, one PR, one issue comment."""

from __future__ import annotations

import subprocess

import httpx
import pytest
from temporalio.api.enums.v1 import EventType

from clients.iris import IrisClient
from domain.models import MergeAuthorization, PipelineReport, target_workflow_id
from sandbox.stack import MARINSKYRL_SLUG
from tests.e2e.helpers import (
    awaiting_merge,
    checks_green,
    request,
    start_pipeline,
    stop_process,
    wait_until,
    waiting_on_visibility,
    worker_process,
)
from workflows.pipeline import BuildPipelineWorkflow
from workflows.target import TargetBuildWorkflow

pytestmark = pytest.mark.stack
KEYS = ["amd64-standard", "amd64-megatron", "arm64-standard", "arm64-megatron"]


async def test_two_workers_build_four_targets_with_every_side_effect_once(service_config):
    s = service_config
    workers = [worker_process(s.config_path, s.state_dir / f"worker-{i}.log") for i in (1, 2)]
    try:
        handle = await start_pipeline(s, request(archs=("amd64", "arm64"), variants=("standard", "megatron"),
                                                 issue_url="https://github.com/marin-community/MarinSkyRL/issues/7"))
        wid = handle.id
        for key in KEYS:
            await wait_until(lambda k=key: waiting_on_visibility(s.client, wid, k), timeout=400, what=f"{key} waiting")
        s.token_registry.set_public(s.image_repo_path, True)
        for key in KEYS:
            await s.client.get_workflow_handle(target_workflow_id(wid, key)).signal(TargetBuildWorkflow.recheck)
        rep = await wait_until(lambda: awaiting_merge(s.client, wid), timeout=300, what="PR opened")
        s.github.set_check(MARINSKYRL_SLUG, rep.pull_request.head_sha, "ci")
        await wait_until(lambda: checks_green(s.client, wid), what="checks green")
        await handle.execute_update(BuildPipelineWorkflow.approve_merge, MergeAuthorization(by="tester"))
        final: PipelineReport = await handle.result()
        histories = [await s.client.get_workflow_handle(w).fetch_history() for w in [wid, *(target_workflow_id(wid, k) for k in KEYS)]]
    finally:
        codes = [stop_process(w) for w in workers]
    assert codes == [0, 0]
    assert final.status == "merged" and sorted(t.key for t in final.targets) == sorted(KEYS)
    sha = final.source.build_commit

    # Both processes did the work.
    identities = {e.activity_task_started_event_attributes.identity for h in histories for e in h.events
                  if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED}
    assert {i.rsplit(":", 1)[-1] for i in identities} == {str(w.pid) for w in workers}

    # One Iris job per target.
    async with IrisClient(s.iris.url, client_revision_date=s.config.clusters["sandbox-amd64"].client_revision_date) as iris:
        jobs = [j.job_id for j in await iris.list_jobs(prefix="/gpu-rl-builder/") if sha[:8] in j.job_id]
    assert len(jobs) == 4 and all(sum(f"gpurl-kaniko-{k}-{sha[:8]}" in j for j in jobs) == 1 for k in KEYS), jobs
    assert sorted(jobs) == sorted(j for t in final.targets for j in t.job_ids)

    # One build commit and one pin commit (found by their Build-Request trailers on every ref).
    trailers = subprocess.run(
        ["git", "--git-dir", s.remotes.marinskyrl_url.removeprefix("file://"), "log", "--all",
         "--format=%(trailers:key=Build-Request,valueonly)"], capture_output=True, text=True, check=True).stdout.split()
    assert trailers.count(wid) == 1 and trailers.count(f"{wid}-pins") == 1, trailers

    # One PR, one comment on the associated issue.
    auth = {"Authorization": f"token {s.github.token}"}
    async with httpx.AsyncClient(base_url=s.github.api_url, headers=auth) as gh:
        pulls = (await gh.get(f"/repos/{MARINSKYRL_SLUG}/pulls", params={"state": "all"})).json()
        comments = (await gh.get(f"/repos/{MARINSKYRL_SLUG}/issues/7/comments")).json()
    assert [p["number"] for p in pulls if p["head"]["ref"] == final.source.branch] == [final.pull_request.number]
    assert len(pulls) == 1 and len(comments) == 1
    # The PR carries each build log's evidence-store URI and digest (not a worker-local path).
    body = pulls[0]["body"]
    for t in final.targets:
        assert t.log_check.log.uri in body and t.log_check.log.sha256[:16] in body
    assert s.config.work_dir not in body
