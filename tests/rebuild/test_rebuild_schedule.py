"""The rebuild check as operators run it: a real Temporal Schedule (overlap SKIP), triggered by hand.

Built like ``starter.py schedule create`` builds it; the decision is read from the scheduled run's result.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from temporalio.client import (
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
)

from domain.models import RebuildCheckResult
from sandbox.git_remotes import commit_to_remote
from tests.e2e.helpers import wait_until
from tests.rebuild.helpers import check_input, git_show, pin_current_head, stop_pipeline
from workflows.rebuild import RebuildCheckWorkflow, pipeline_id

pytestmark = pytest.mark.stack

PPO_CONFIG = "skyrl-train/skyrl_train/config/ppo_base_config.yaml"


async def test_triggered_schedule_records_the_decision_and_starts_the_pipeline(service_stack):
    s = service_stack
    url = s.remotes.marinskyrl_url
    pinned = pin_current_head(s, harbor_commit=s.remotes.harbor_head)
    new_head = commit_to_remote(url, {PPO_CONFIG: git_show(url, "main", PPO_CONFIG) + "# knob\n"}, "Trainer knob")
    sid = f"rebuild-check-test-{uuid.uuid4().hex[:8]}"
    schedule = await s.client.create_schedule(sid, Schedule(
        action=ScheduleActionStartWorkflow(RebuildCheckWorkflow.run, check_input(start_pipeline=True),
                                           id=f"rebuild-check-{sid}", task_queue=s.task_queue),
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=timedelta(days=7))]),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP)))
    wid = pipeline_id(new_head, s.remotes.harbor_head)
    try:
        await schedule.trigger()
        desc = await wait_until(lambda: _with_action(schedule), timeout=60, what="the scheduled run")
        (action,) = desc.info.recent_actions
        run = s.client.get_workflow_handle(action.action.workflow_id, run_id=action.action.first_execution_run_id,
                                           result_type=RebuildCheckResult)
        assert run.id.startswith(f"rebuild-check-{sid}")
        res = await run.result()
        d = res.decision
        assert d.needed and d.last_source_commit == pinned and d.source_commit == new_head
        assert any(r.startswith(PPO_CONFIG) for r in d.reasons)
        assert res.started and res.pipeline_workflow_id == wid
        # ABANDON: the pipeline outlives the finished check.
        assert (await s.client.get_workflow_handle(wid).describe()).workflow_type == "BuildPipelineWorkflow"
    finally:
        await stop_pipeline(s.client.get_workflow_handle(wid))
        await schedule.delete()


async def _with_action(schedule):
    desc = await schedule.describe()
    return desc if desc.info.recent_actions else None


async def test_cancelled_scheduled_rebuild_is_shown_held_in_describe_and_force_restarts_it(service_stack):
    """Through the CLI (issue 39): `cancel` of the started rebuild; the next `schedule trigger` holds it and
    `schedule describe` says so; `schedule trigger --force` starts it again."""
    import re

    from temporalio.client import WorkflowExecutionStatus

    from tests.cli.starter_cli import starter

    s = service_stack
    cfg = s.config_path
    url = s.remotes.marinskyrl_url
    pin_current_head(s, harbor_commit=s.remotes.harbor_head)
    new_head = commit_to_remote(url, {PPO_CONFIG: git_show(url, "main", PPO_CONFIG) + "# knob\n"}, "Trainer knob")
    wid = pipeline_id(new_head, s.remotes.harbor_head)
    sid = f"rebuild-hold-{uuid.uuid4().hex[:8]}"
    schedule = await s.client.create_schedule(sid, Schedule(
        action=ScheduleActionStartWorkflow(RebuildCheckWorkflow.run, check_input(start_pipeline=True),
                                           id=f"rebuild-check-{sid}", task_queue=s.task_queue),
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=timedelta(days=7))]),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP)))
    pipeline = s.client.get_workflow_handle(wid)
    try:
        assert (await starter(cfg, "schedule", "trigger", sid)).code == 0
        await wait_until(lambda: _n_checks_done(s, schedule, 1), timeout=90, what="the first check")
        cancelled = await starter(cfg, "cancel", wid)
        assert cancelled.code == 0, cancelled.text

        async def is_cancelled():
            return (await pipeline.describe()).status == WorkflowExecutionStatus.CANCELED or None

        await wait_until(is_cancelled, timeout=300, what="the rebuild cancelled")  # its activities end first
        run = (await pipeline.describe()).run_id
        assert (await starter(cfg, "schedule", "trigger", sid)).code == 0
        await wait_until(lambda: _n_checks_done(s, schedule, 2), timeout=90, what="the second check")
        shown = await starter(cfg, "schedule", "describe", sid)
        assert shown.code == 0, shown.text
        assert f"an operator cancelled {wid}" in shown.out and "held until the source or Harbor commit" in shown.out
        assert (await pipeline.describe()).run_id == run, "the cancelled rebuild was not restarted"

        forced = await starter(cfg, "schedule", "trigger", sid, "--force")
        assert forced.code == 0, forced.text
        check_id = re.search(r"forced rebuild check (\S+) started", forced.out).group(1)
        res = await s.client.get_workflow_handle(check_id, result_type=RebuildCheckResult).result()
        assert res.started and res.pipeline_workflow_id == wid and "--force" in res.note
        assert (await pipeline.describe()).run_id != run
    finally:
        await stop_pipeline(pipeline)
        await schedule.delete()


async def _n_checks_done(s, schedule, n: int):
    desc = await schedule.describe()
    if len(desc.info.recent_actions) < n:
        return None
    for a in desc.info.recent_actions:
        h = s.client.get_workflow_handle(a.action.workflow_id, run_id=a.action.first_execution_run_id)
        if (await h.describe()).close_time is None:
            return None
    return desc
