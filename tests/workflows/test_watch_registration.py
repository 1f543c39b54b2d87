"""200 targets starting at once register with their cluster's watcher without a timeout (issue 37 item 1).

The real ``watch_job`` activity on the Temporal dev server, 200 tiny workflows that each run it with the
production options (``workflows/options.py`` WATCH_JOB: 10 s heartbeat timeout, 2 min per attempt) at the
same moment, a stand-in job list on the Iris side, and the worker pair ``worker.py`` runs (the main queue,
and the watcher's own queue). Before: one signal-with-start per registration, all on the watcher's one
workflow, and ``watch_job`` never heartbeated — 26 of 200 timed out on a loaded machine. Now registrations
that arrive while one is in flight go together in one ``watch_many`` signal, and ``watch_job`` heartbeats.

Every status request of the cluster is the watcher's, inside its window of ``watch_status_budget_per_min``
(12) in any sliding minute: a registration asks the controller nothing, the watcher's poll reads the states and
wakes the targets with them. Before, each ``watch_job`` read ``GetJobStatus`` outside the window: 200 in the
minute of the start (this test then fails on the wire count).
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from datetime import timedelta

from temporalio.api.enums.v1 import EventType
from temporalio.testing import ActivityEnvironment
from temporalio.worker import Worker

from activities import watch as watch_module
from activities.watch import WatchActivities
from domain.config import PolicySettings, ServiceConfig
from domain.models import JobProgress
from domain.watch import PageRequest, WatchJobInput, WatchPage, watcher_id, watcher_task_queue
from tests.activities.test_watch_status_cap import STATUS, most_in_a_minute
from tests.iris.standin_jobs import StandinJobs
from tests.workflows.receiver import Registrant
from tests.workflows.standins import eventually, watcher_config
from worker import polling
from workflows.watcher import IrisWatcherWorkflow

N_TARGETS = 200
MARKERS = ["=== [build 01/02] start ===", "=== [build 02/02] pushed ==="]


def _config(tmp_path, cluster: str) -> ServiceConfig:
    return watcher_config(tmp_path, cluster)


async def test_200_targets_starting_together_register_without_a_timeout(temporal_client, tmp_path):
    run = uuid.uuid4().hex[:8]
    cluster, tq = f"reg-{run}", f"tq-reg-{run}"
    jobs = [f"/runner/reg-{run}-{i:03d}" for i in range(N_TARGETS)]
    iris = StandinJobs({j: "pending" for j in jobs})  # queued: the watcher polls, nothing ends
    watch = WatchActivities(_config(tmp_path, cluster), transport=iris)
    wid = watcher_id(cluster, tq)
    sent_before = watch_module._REGISTRATIONS.signals
    async with Worker(temporal_client, task_queue=tq, workflows=[Registrant], activities=[watch.watch_job],
                      max_concurrent_activities=500, max_concurrent_workflow_tasks=200, **polling()), \
            Worker(temporal_client, task_queue=watcher_task_queue(tq), workflows=[IrisWatcherWorkflow],
                   activities=[watch.watch_cluster]):
        handles = await asyncio.gather(*(temporal_client.start_workflow(
            Registrant.run, WatchJobInput(cluster=cluster, job_id=j, workflow_id=f"reg-{run}-{i}", markers=MARKERS,
                                          registered_at="2026-12-01T00:00:00+00:00"),
            id=f"reg-{run}-{i}", task_queue=tq, execution_timeout=timedelta(minutes=5))
            for i, j in enumerate(jobs)))
        results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 240)

        async def held() -> WatchPage | None:
            page = await temporal_client.get_workflow_handle(wid).query("changes", PageRequest(), result_type=WatchPage)
            return page if page.watched == N_TARGETS else None
        page = await eventually(held, what="the watcher holds every registration", attempts=300, interval=0.2)
        desc = await temporal_client.get_workflow_handle(wid).describe()
        signals = 0
        async for e in temporal_client.get_workflow_handle(wid).fetch_history_events():
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
                signals += 1
        await temporal_client.get_workflow_handle(wid).terminate("test over")

    # Each target learned its job's state from the watcher's poll (the registration read nothing).
    assert [r.state for r in results] == ["pending"] * N_TARGETS
    # Every status request the controller saw was the watcher's, within its cap in any sliding minute.
    status_at = [t for m, _, t in iris.calls if m in STATUS]
    assert iris.requests["GetJobStatus"] == 0, dict(iris.requests)
    assert most_in_a_minute(status_at) <= PolicySettings().watch_status_budget_per_min, dict(iris.requests)
    # No registration timed out or was retried: every watch_job completed on its first attempt.
    timed_out, retried = [], []
    for h in handles:
        async for e in h.fetch_history_events():
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT:
                timed_out.append(h.id)
            elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED \
                    and e.activity_task_started_event_attributes.attempt > 1:
                retried.append(h.id)
    assert not timed_out and not retried, (timed_out, retried)
    assert {w.job_id for w in page.watches} == set(jobs)
    # Batched: a fraction of the signals on the watcher's one workflow (before: one per target, 200).
    sent = watch_module._REGISTRATIONS.signals - sent_before
    assert signals <= N_TARGETS // 2 and sent <= N_TARGETS // 2, (signals, sent)
    print(f"{N_TARGETS} registrations in {sent} signal-with-starts")
    # The watcher runs on its own queue: its tasks never wait behind the targets'.
    assert desc.task_queue == watcher_task_queue(tq)


async def test_a_safety_recheck_without_a_live_watcher_registers_again_and_asks_the_controller_nothing(
        temporal_client, tmp_path):
    """No watcher heartbeat to answer a target's safety re-check: ``watch_job`` registers the job again with
    what the target knows (starting the watcher) instead of reading ``GetJobStatus`` outside the watcher's
    window; the watcher's next poll re-reads it. Before, the re-check read the controller itself."""
    run = uuid.uuid4().hex[:8]
    cluster, tq = f"recheck-{run}", f"tq-recheck-{run}"
    job = f"/runner/recheck-{run}"
    iris = StandinJobs({job: "succeeded"})
    watch = WatchActivities(_config(tmp_path, cluster), transport=iris)
    env = ActivityEnvironment(client=temporal_client)
    env.info = dataclasses.replace(env.info, task_queue=tq)
    known = JobProgress(job_id=job, state="running", terminal=False)
    got = await env.run(watch.watch_job, WatchJobInput(cluster=cluster, job_id=job, workflow_id=f"t-{run}",
                                                       markers=MARKERS, known=known,
                                                       registered_at="2026-12-01T00:10:00+00:00"))
    assert not iris.requests, dict(iris.requests)
    assert got == known
    wid = watcher_id(cluster, tq)
    registered = []
    async for e in temporal_client.get_workflow_handle(wid).fetch_history_events():
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            (arg,) = await temporal_client.data_converter.decode(e.workflow_execution_signaled_event_attributes.input.payloads)
            registered.extend(arg)
    await temporal_client.get_workflow_handle(wid).terminate("test over")
    assert [(r["job_id"], r["known"]["state"]) for r in registered] == [(job, "running")]
