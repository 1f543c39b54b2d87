"""The rebuild boundary decides per variant, and an operator's cancel of a scheduled rebuild holds (issue 39).

On the real stack (dev server, worker, git remotes). Variants pinned at different source commits (an
operator's standard-only build) are each compared from their own pin; a cancelled rebuild of the same
commits is not started again by the next check until an input changes (or ``--force``).
"""

from __future__ import annotations

import pytest
from temporalio.client import WorkflowExecutionStatus

from sandbox.git_remotes import commit_to_remote
from tests.e2e.helpers import wait_until
from tests.rebuild.helpers import git_show, pin_current_head, pipelines_on_queue, run_check, stop_pipeline
from workflows.rebuild import pipeline_id

pytestmark = pytest.mark.stack

CFG = "cloud/iris/configs/harbor_fsdp2_smoke.yaml"
PPO_CONFIG = "skyrl-train/skyrl_train/config/ppo_base_config.yaml"
BOTH = ("standard", "megatron")


def _touch(stack, path: str, what: str) -> str:
    url = stack.remotes.marinskyrl_url
    return commit_to_remote(url, {path: git_show(url, "main", path) + f"# {what}\n"}, what)


async def test_variants_pinned_at_different_commits_with_no_crossing_change_need_no_rebuild(service_stack):
    s = service_stack
    harbor = s.remotes.harbor_head
    megatron_pin = pin_current_head(s, harbor_commit=harbor)
    _touch(s, CFG, "Tweak the smoke config")  # launcher config only: reaches jobs through the bundle
    standard_pin = pin_current_head(s, harbor_commit=harbor, variants=("standard",))  # a standard-only build
    assert standard_pin != megatron_pin
    quiet = await run_check(s, start_pipeline=False, variants=BOTH)
    d = quiet.decision
    assert not d.needed, d.reasons
    assert d.reasons[0].startswith("no rebuild needed: no change crossed the rebuild boundary for any variant since its own pin")
    assert f"amd64-standard ({standard_pin[:12]})" in d.reasons[0]
    assert f"amd64-megatron ({megatron_pin[:12]})" in d.reasons[0]
    assert any(r.startswith(CFG) and "amd64-megatron" in r for r in d.reasons), d.reasons
    assert d.rebuild_targets == [] and not quiet.started

    # A change crossing the boundary before the standard-only build reached only the megatron image.
    _touch(s, PPO_CONFIG, "Add a trainer knob")
    pin_current_head(s, harbor_commit=harbor, variants=("standard",))
    loud = await run_check(s, start_pipeline=False, variants=BOTH)
    assert loud.decision.needed and loud.decision.rebuild_targets == ["amd64-megatron"], loud.decision.reasons
    assert loud.decision.reasons[0].startswith(PPO_CONFIG) and "(amd64-megatron," in loud.decision.reasons[0]


async def test_a_cancelled_scheduled_rebuild_is_held_until_an_input_changes(service_stack):
    s = service_stack
    pin_current_head(s, harbor_commit=s.remotes.harbor_head)
    head = _touch(s, PPO_CONFIG, "Add a trainer knob")
    wid = pipeline_id(head, s.remotes.harbor_head)
    first = await run_check(s, start_pipeline=True)
    handle = s.client.get_workflow_handle(wid)
    try:
        assert first.started and first.pipeline_workflow_id == wid
        await handle.cancel()  # what `starter.py cancel` does

        async def cancelled():
            return (await handle.describe()).status == WorkflowExecutionStatus.CANCELED or None

        await wait_until(cancelled, timeout=300, what="the pipeline cancelled")  # its activities end first
        run = (await handle.describe()).run_id
        held = await run_check(s, start_pipeline=True)
        assert held.decision.needed and not held.started and held.pipeline_workflow_id == wid
        assert held.held_by_cancel.startswith(f"an operator cancelled {wid}")
        assert "held until the source or Harbor commit changes" in held.note and "--force" in held.note
        assert (await handle.describe()).run_id == run, "the cancelled run was not replaced"

        forced = await run_check(s, start_pipeline=True, force=True)  # `schedule trigger --force`
        assert forced.started and "--force" in forced.note
        assert (await handle.describe()).run_id != run
    finally:
        await stop_pipeline(handle)
    # An input changes: the check starts the rebuild of the new commits.
    newer = _touch(s, PPO_CONFIG, "Another trainer knob")
    again = await run_check(s, start_pipeline=True)
    try:
        assert again.started and again.pipeline_workflow_id == pipeline_id(newer, s.remotes.harbor_head)
        assert not again.held_by_cancel
        ids = await wait_until(lambda: _n(pipelines_on_queue(s.client, s.task_queue), 3), timeout=30,
                               what="three pipeline runs in visibility")
        assert sorted(ids) == sorted([wid, wid, again.pipeline_workflow_id])
    finally:
        await stop_pipeline(s.client.get_workflow_handle(again.pipeline_workflow_id))


async def _n(ids_coro, n: int):
    ids = await ids_coro
    return ids if len(ids) == n else None
