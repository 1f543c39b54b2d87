"""A target's history grows with its job's changes, not with time (time-skipping server).

A job that sits pending for 3 (or 30) days adds no activity while nothing changes: the only activities
are the registration with the cluster watcher and the safety re-checks (every
``monitor_safety_interval_s``, backing off to 3× while nothing changes), and the run stays below
Temporal's 10,240-event warning without continue-as-new."""

from __future__ import annotations

import uuid

import pytest
from temporalio.api.enums.v1 import EventType

from domain.config import PolicySettings
from domain.models import TargetResult
from tests.workflows.standins import Round, Standins, result, target_input, worker
from workflows.target import SAFETY_BACKOFF_MAX, TargetBuildWorkflow

KEY = "amd64-standard"
EVENT_WARNING = 10_240


@pytest.mark.parametrize("days", [3, 30])
async def test_a_job_pending_for_days_adds_activities_only_at_safety_rechecks(time_skipping_env, days):
    u = uuid.uuid4().hex[:8]
    wid, tq = f"wf-pending-{u}", f"tq-{u}"
    policy = PolicySettings()
    pending_s = days * 86400
    s = Standins(rounds={KEY: [Round(pending_for_s=pending_s)]}, policy=policy)
    async with worker(time_skipping_env.client, tq, s):
        handle = await time_skipping_env.client.start_workflow(TargetBuildWorkflow.run, target_input(wid), id=wid,
                                                               task_queue=tq)
        res: TargetResult = await result(handle, timeout=180)
        history = await handle.fetch_history()

    assert res.status == "validated"
    events = history.events
    assert len(events) < EVENT_WARNING
    scheduled = [(e.event_time.ToSeconds(), e.activity_task_scheduled_event_attributes.activity_type.name)
                 for e in events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED]
    names = [n for _, n in scheduled]
    first, last = names.index("watch_job"), len(names) - 1 - names[::-1].index("watch_job")
    monitoring = scheduled[first:last + 1]
    # While the job sat pending, only watch_job ran: the registration, then the safety re-checks, spaced
    # by the safety interval and backing off to SAFETY_BACKOFF_MAX times it while nothing changed.
    assert {n for _, n in monitoring} == {"watch_job"}
    gaps = [b - a for (a, _), (b, _) in zip(monitoring, monitoring[1:], strict=False)]
    step = policy.monitor_safety_interval_s
    expected = [step * min(i + 1, SAFETY_BACKOFF_MAX) for i in range(len(gaps))]
    assert all(abs(g - e) <= 5 for g, e in zip(gaps, expected, strict=True)), (gaps[:5], expected[:5])
    assert sum(gaps) >= pending_s > sum(gaps[:-1])  # the first re-check after the job left the queue ended it
    assert s.names("monitor_job") == []
