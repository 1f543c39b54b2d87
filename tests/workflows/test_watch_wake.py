"""The watcher wakes a target on a state change with the target's ``wake`` update (issue 37: one persisted
workflow task that also schedules the target's next step, where a signal costs two more persisted writes
first; measured p95 2.1 / 1.2 s against 4.1 / 7.7 s with 50 targets woken at once). A target of the previous
release (``job_changed`` signal only) rejects the update and is signalled instead; a repeated wake-up is
deduplicated by its id and changes nothing.

The real IrisWatcherWorkflow and ``watch_cluster`` on the Temporal dev server, a stand-in job list on the
Iris side; what each receiver got is read back from its history."""

from __future__ import annotations

import uuid

from temporalio.api.enums.v1 import EventType
from temporalio.worker import Worker

from activities.watch import WatchActivities, _wake_now
from domain.config import PolicySettings, ServiceConfig
from domain.models import JobProgress
from domain.watch import WatcherInput, WatchRequest, watcher_id, watcher_task_queue
from tests.iris.standin_jobs import StandinJobs
from tests.workflows.receiver import EndReceiver, SignalOnlyReceiver
from tests.workflows.standins import watcher_config
from workflows.watcher import IrisWatcherWorkflow

POLICY = PolicySettings(watch_interval_s=0.5, watch_fast_interval_s=0.5, watch_idle_interval_s=0.5,
                        watch_status_budget_per_min=600, watch_log_interval_s=60, watch_signal_progress_s=3600)


def _config(tmp_path, cluster: str) -> ServiceConfig:
    return watcher_config(tmp_path, cluster, POLICY)


async def _received(client, wid: str) -> list[tuple[str, str, bool]]:
    """(how, state, terminal) of every wake-up in a receiver's history: ``update`` or ``signal``."""
    got = []
    async for e in client.get_workflow_handle(wid).fetch_history_events():
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
            payloads = e.workflow_execution_update_accepted_event_attributes.accepted_request.input.args.payloads
            how = "update"
        elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            payloads = e.workflow_execution_signaled_event_attributes.input.payloads
            how = "signal"
        else:
            continue
        (p,) = await client.data_converter.decode(payloads, [JobProgress])
        got.append((how, p.state, p.terminal))
    return got


async def _watch_running(client, cluster: str, tq: str, handles: dict) -> None:
    """Start the cluster's watcher with each job (running) registered for its receiver, as ``watch_job`` does."""
    await client.start_workflow(
        IrisWatcherWorkflow.run, WatcherInput(cluster=cluster), id=watcher_id(cluster, tq),
        task_queue=watcher_task_queue(tq), start_signal="watch_many", start_signal_args=[[
            WatchRequest(job_id=j, workflow_id=h.id, known=JobProgress(job_id=j, state="running", terminal=False),
                         registered_at="2026-12-01T00:00:00+00:00")
            for j, h in handles.items()]])


async def test_an_end_wakes_the_target_with_its_update_and_a_previous_release_target_with_the_signal(
        temporal_client, tmp_path):
    run = uuid.uuid4().hex[:8]
    cluster, tq = f"wake-{run}", f"tq-wake-{run}"
    new_job, old_job = f"/runner/wake-{run}-new", f"/runner/wake-{run}-old"
    iris = StandinJobs({new_job: "running", old_job: "running"})
    watch = WatchActivities(_config(tmp_path, cluster), transport=iris)
    async with Worker(temporal_client, task_queue=tq, workflows=[EndReceiver, SignalOnlyReceiver]), \
            Worker(temporal_client, task_queue=watcher_task_queue(tq), workflows=[IrisWatcherWorkflow],
                   activities=[watch.watch_cluster]):
        new = await temporal_client.start_workflow(EndReceiver.run, id=f"new-{run}", task_queue=tq)
        old = await temporal_client.start_workflow(SignalOnlyReceiver.run, id=f"old-{run}", task_queue=tq)
        await _watch_running(temporal_client, cluster, tq, {new_job: new, old_job: old})
        iris.set_state(new_job, "succeeded")
        iris.set_state(old_job, "failed")
        got_new = await new.result()
        got_old = await old.result()
        # A repeated wake-up (a retried round, a restarted watcher) carries the same update id: deduplicated.
        await _wake_now(temporal_client, new.id, got_new)
        await temporal_client.get_workflow_handle(watcher_id(cluster, tq)).terminate("test over")
    assert (got_new.state, got_old.state) == ("succeeded", "failed")
    assert await _received(temporal_client, new.id) == [("update", "succeeded", True)]
    assert await _received(temporal_client, old.id) == [("signal", "failed", True)]


async def test_an_end_is_woken_at_once_while_another_targets_wake_up_is_still_waiting(
        temporal_client, tmp_path, monkeypatch):
    """A target slow to take its update (here: no worker on its queue, so the update waits its whole bound before
    the signal) does not hold back the wake-up of another target whose job ends meanwhile. Before, the wake-ups
    went in rounds and an end seen during a round waited for the round's slowest wake-up: here ~8 s."""
    import asyncio
    import time

    import activities.watch as watch_mod

    monkeypatch.setattr(watch_mod, "RPC_DEADLINE_S", 10.0)
    run = uuid.uuid4().hex[:8]
    cluster, tq = f"wake-slow-{run}", f"tq-wake-slow-{run}"
    slow_job, quick_job = f"/runner/wake-{run}-slow", f"/runner/wake-{run}-quick"
    iris = StandinJobs({slow_job: "running", quick_job: "running"})
    watch = WatchActivities(_config(tmp_path, cluster), transport=iris)
    async with Worker(temporal_client, task_queue=tq, workflows=[EndReceiver]), \
            Worker(temporal_client, task_queue=watcher_task_queue(tq), workflows=[IrisWatcherWorkflow],
                   activities=[watch.watch_cluster]):
        quick = await temporal_client.start_workflow(EndReceiver.run, id=f"quick-{run}", task_queue=tq)
        slow = await temporal_client.start_workflow(EndReceiver.run, id=f"slow-{run}", task_queue=f"{tq}-nobody")
        await _watch_running(temporal_client, cluster, tq, {slow_job: slow, quick_job: quick})
        iris.set_state(slow_job, "failed")
        # A poll after the end has seen it, so the slow target's wake-up is in flight: its update waits up to 10 s.
        mark = len(iris.calls)
        for _ in range(600):
            if any(m in ("GetJobState", "ListJobs") for m, _c, _at in iris.calls[mark:]):
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError(f"the watcher did not poll within 30 s: {iris.requests}")
        await asyncio.sleep(1.0)
        iris.set_state(quick_job, "succeeded")
        began = time.monotonic()
        got = await asyncio.wait_for(quick.result(), 30)
        took = time.monotonic() - began
        await temporal_client.get_workflow_handle(watcher_id(cluster, tq)).terminate("test over")
        await slow.terminate("test over")
    assert got.state == "succeeded"
    assert await _received(temporal_client, slow.id) == []  # its wake-up was still waiting for a worker
    assert took < 5.0, f"the quick target was woken {took:.1f}s after its end, behind the slow one's wake-up"
