"""RebuildCheckWorkflow on the real stack (dev server, worker, git remotes): the deploy boundary decides.

Each test first commits a pin table naming the current head (see helpers), then makes one change and
runs the check. Started pipelines are terminated at once: only "was it started, once, under the dedup
id" is under test here, not the build.
"""

from __future__ import annotations

import pytest

from sandbox.git_remotes import advance_harbor, commit_to_remote, remote_head
from tests.e2e.helpers import wait_until
from tests.rebuild.helpers import (
    git_show,
    pin_current_head,
    pipelines_on_queue,
    run_check,
    stop_pipeline,
    workflow_exists,
)
from workflows.rebuild import pipeline_id

pytestmark = pytest.mark.stack

PIN_TABLE = "cloud/iris/gpu_rl_images.py"
PPO_CONFIG = "skyrl-train/skyrl_train/config/ppo_base_config.yaml"


async def test_made_up_pinned_source_means_rebuild_to_restore_provenance(service_stack):
    s = service_stack
    head = remote_head(s.remotes.marinskyrl_url)
    res = await run_check(s, start_pipeline=False)
    d = res.decision
    assert d.needed and d.source_commit == head and d.harbor_commit == s.remotes.harbor_head
    assert d.last_source_commit == "4faf0dee5b1c3a7e9d2f8a6c4e1b3d5f7a9c2e4b"  # the fixture's made-up commit
    assert any("provenance" in r for r in d.reasons)
    assert res.pipeline_workflow_id == pipeline_id(head, s.remotes.harbor_head) and not res.started
    assert "not started" in res.note
    assert not await workflow_exists(s.client, res.pipeline_workflow_id)


async def test_change_only_under_cloud_iris_needs_no_rebuild(service_stack):
    s = service_stack
    url = s.remotes.marinskyrl_url
    pinned = pin_current_head(s, harbor_commit=s.remotes.harbor_head)
    cfg = "cloud/iris/configs/harbor_fsdp2_smoke.yaml"
    new_head = commit_to_remote(url, {cfg: git_show(url, "main", cfg) + "# tuned rollout batch\n"},
                                "Tune the smoke config")
    res = await run_check(s, start_pipeline=True)  # allowed to start one, and must not
    d = res.decision
    assert not d.needed, d.reasons
    assert d.last_source_commit == pinned and d.source_commit == new_head
    assert d.last_harbor_commit == d.harbor_commit == s.remotes.harbor_head
    assert sorted(d.changed_paths) == sorted([PIN_TABLE, cfg])
    assert all("no rebuild" in r for r in d.reasons), d.reasons
    assert res.note == "no rebuild needed" and not res.started and res.pipeline_workflow_id is None
    assert not await workflow_exists(s.client, pipeline_id(new_head, s.remotes.harbor_head))
    assert await pipelines_on_queue(s.client, s.task_queue) == []


async def test_change_under_skyrl_train_starts_exactly_one_pipeline(service_stack):
    s = service_stack
    url = s.remotes.marinskyrl_url
    pinned = pin_current_head(s, harbor_commit=s.remotes.harbor_head)
    new_head = commit_to_remote(url, {PPO_CONFIG: git_show(url, "main", PPO_CONFIG) + "# new trainer knob\n"},
                                "Add a trainer knob to the PPO base config")
    wid = pipeline_id(new_head, s.remotes.harbor_head)
    assert wid == f"gpu-rl-build-{new_head[:12]}-{s.remotes.harbor_head[:12]}"
    first = await run_check(s, start_pipeline=True)
    handle = s.client.get_workflow_handle(wid)
    try:
        d = first.decision
        assert d.needed and d.last_source_commit == pinned and d.source_commit == new_head
        assert PPO_CONFIG in d.changed_paths
        assert any(r.startswith(PPO_CONFIG) and "rebuild required" in r for r in d.reasons), d.reasons
        assert first.started and first.pipeline_workflow_id == wid and first.note == f"started {wid}"
        desc = await handle.describe()
        assert desc.workflow_type == "BuildPipelineWorkflow"

        # The schedule fires again while that build runs: same commits, so nothing new starts.
        second = await run_check(s, start_pipeline=True)
        assert second.decision.needed and second.pipeline_workflow_id == wid
        assert not second.started and "already exists" in second.note
        assert (await handle.describe()).run_id == desc.run_id
        ids = await wait_until(lambda: pipelines_on_queue(s.client, s.task_queue), timeout=30,
                               what="the started pipeline in visibility")
        assert ids == [wid]
    finally:
        await stop_pipeline(handle)


async def test_harbor_move_starts_one_pipeline_and_a_failed_attempt_is_built_again(service_stack):
    s = service_stack
    pinned_harbor = s.remotes.harbor_head
    pinned = pin_current_head(s, harbor_commit=pinned_harbor)
    head = remote_head(s.remotes.marinskyrl_url)
    moved = advance_harbor(s.remotes, 4)  # docs-only Harbor commit: still a different baked HARBOR_COMMIT
    wid = pipeline_id(head, moved)
    first = await run_check(s, start_pipeline=True)
    handle = s.client.get_workflow_handle(wid)
    try:
        d = first.decision
        assert d.needed and d.harbor_commit == moved and d.last_harbor_commit == pinned_harbor
        assert d.last_source_commit == pinned and d.changed_paths == [PIN_TABLE]
        assert any(r.startswith("Harbor moved") for r in d.reasons), d.reasons
        assert first.started and first.pipeline_workflow_id == wid
        first_run = (await handle.describe()).run_id
    finally:
        await stop_pipeline(handle)
    # That pipeline was terminated: attempted and failed, not built and merged. The next check builds
    # the same (source, Harbor) pair again, as a new run of the same pipeline id.
    again = await run_check(s, start_pipeline=True)
    try:
        assert again.pipeline_workflow_id == wid and again.started and again.note == f"started {wid}"
        assert (await handle.describe()).run_id != first_run
        ids = await wait_until(lambda: _two(pipelines_on_queue(s.client, s.task_queue)), timeout=30,
                               what="both runs in visibility")
        assert ids == [wid, wid]
    finally:
        await stop_pipeline(s.client.get_workflow_handle(wid))


async def _two(ids_coro):
    ids = await ids_coro
    return ids if len(ids) == 2 else None
