"""A target's history grows with its job's changes, not with time (time-skipping server).

A job that sits pending for 3 days adds no activity while nothing changes: the only activities are
the registration with the cluster watcher and one safety re-check per ``monitor_safety_interval_s``,
and the run stays far below Temporal's 10,240-event warning."""

from __future__ import annotations

import uuid

from temporalio.api.enums.v1 import EventType

from domain.config import PolicySettings
from domain.models import TargetResult
from tests.workflows.standins import Round, Standins, result, target_input, worker
from workflows.target import TargetBuildWorkflow

KEY = "amd64-standard"
THREE_DAYS_S = 3 * 86400
EVENT_WARNING = 10_240


async def test_a_job_pending_for_three_days_adds_activities_only_at_safety_rechecks(time_skipping_env):
    u = uuid.uuid4().hex[:8]
    wid, tq = f"wf-pending-{u}", f"tq-{u}"
    policy = PolicySettings()
    s = Standins(rounds={KEY: [Round(pending_for_s=THREE_DAYS_S)]}, policy=policy)
    async with worker(time_skipping_env.client, tq, s):
        handle = await time_skipping_env.client.start_workflow(TargetBuildWorkflow.run, target_input(wid), id=wid,
                                                               task_queue=tq)
        res: TargetResult = await result(handle)
        history = await handle.fetch_history()

    assert res.status == "validated"
    events = history.events
    assert len(events) < EVENT_WARNING
    scheduled = [(e.event_time.ToSeconds(), e.activity_task_scheduled_event_attributes.activity_type.name)
                 for e in events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED]
    names = [n for _, n in scheduled]
    first, last = names.index("watch_job"), len(names) - 1 - names[::-1].index("watch_job")
    monitoring = scheduled[first:last + 1]
    # While the job sat pending, only watch_job ran: the registration, then one re-check per safety interval.
    assert {n for _, n in monitoring} == {"watch_job"}
    gaps = [b - a for (a, _), (b, _) in zip(monitoring, monitoring[1:], strict=False)]
    assert gaps and min(gaps) >= policy.monitor_safety_interval_s
    assert len(monitoring) - 1 == -(-THREE_DAYS_S // int(policy.monitor_safety_interval_s))  # ceil
    assert len(events) / (THREE_DAYS_S / 3600) < 60  # the whole run per hour of pending, setup included
    assert s.names("monitor_job") == []
