"""The watcher at scale: 1,500 watches on one cluster (a stand-in job list on the Iris side, the real
IrisWatcherWorkflow and watch activity on the Temporal dev server). Every payload that crosses Temporal —
query replies, heartbeat details, signals, the continue-as-new input — is measured by a pass-through
payload codec and stays under 512 KB; the watcher continues as new while jobs are watched (the new run
adopts the set in pages) and a job end is still delivered to its target."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid

from temporalio import activity, workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.worker import Worker

with workflow.unsafe.imports_passed_through():
    from activities.watch import WatchActivities
    from domain.config import PolicySettings, ServiceConfig
    from domain.models import JobProgress
    from domain.watch import (
        PageRequest,
        WatchClusterInput,
        WatchClusterResult,
        WatcherInput,
        WatchPage,
        WatchRequest,
        watcher_id,
    )
    from tests.iris.standin_jobs import StandinJobs
    from tests.workflows.receiver import EndReceiver, SizeRecorder, SupersededWatcher
    from tests.workflows.standins import watcher_config
    from workflows.watcher import IrisWatcherWorkflow

N_WATCHES = 1500
LIMIT = 512 * 1024
MARKERS = [f"=== [build {i:02d}/31] step {i} of the GPU-RL image build: a marker line of realistic length ==="
           for i in range(31)]  # like the real contract's 31 marker texts (~2.25 KB per job before)
POLICY = PolicySettings(watch_interval_s=0.5, watch_fast_interval_s=0.5, watch_idle_interval_s=0.5,
                        watch_status_budget_per_min=600, watch_signal_progress_s=3600)


def _config(tmp_path, cluster: str) -> ServiceConfig:
    return watcher_config(tmp_path, cluster, POLICY)


async def test_1500_watches_keep_every_payload_under_512kb_and_an_end_is_delivered(temporal_client, tmp_path):
    run = uuid.uuid4().hex[:8]
    cluster, tq = f"scale-{run}", f"tq-scale-{run}"
    sizes = SizeRecorder()
    client = await Client.connect(temporal_client.service_client.config.target_host,
                                  namespace=temporal_client.namespace,
                                  data_converter=dataclasses.replace(temporal_client.data_converter,
                                                                     payload_codec=sizes))
    job_ids = [f"/runner/gpu-rl-{run}-{i:05d}-amd64-standard-r0" for i in range(N_WATCHES)]
    iris = StandinJobs({j: "running" for j in job_ids})
    receiver_id, ended = f"receiver-{run}", job_ids[N_WATCHES // 2]
    wid = watcher_id(cluster, tq)
    requests = [WatchRequest(job_id=j, workflow_id=receiver_id if j == ended else f"gone-{run}-{i}",
                             markers=MARKERS, registered_at="2026-12-01T00:00:00+00:00",
                             known=JobProgress(job_id=j, state="running", terminal=False))
                for i, j in enumerate(job_ids)]
    watch = WatchActivities(_config(tmp_path, cluster), transport=iris)
    starts: list[float] = []  # when each watch activity attempt began (a restart rebuilds from the workflow)

    @activity.defn(name="watch_cluster")
    async def counted_watch_cluster(inp: WatchClusterInput) -> WatchClusterResult:
        starts.append(asyncio.get_running_loop().time())
        return await watch.watch_cluster(inp)

    async with Worker(client, task_queue=tq, workflows=[IrisWatcherWorkflow, EndReceiver],
                      activities=[counted_watch_cluster], max_concurrent_activities=10):
        receiver = await client.start_workflow(EndReceiver.run, id=receiver_id, task_queue=tq)
        # A short run (400 events): 1,500 registrations make the watcher continue as new while it watches.
        h = await client.start_workflow(IrisWatcherWorkflow.run, WatcherInput(cluster=cluster, events_per_run=400),
                                        id=wid, task_queue=tq, start_signal="watch", start_signal_args=[requests[0]])
        first_run = h.result_run_id
        sem = asyncio.Semaphore(32)

        async def register(req: WatchRequest) -> None:
            async with sem:
                await client.get_workflow_handle(wid).signal("watch", req)
        await asyncio.gather(*(register(r) for r in requests[1:]))

        async def watched_all() -> WatchPage | None:
            if (await client.get_workflow_handle(wid).describe()).run_id == first_run:
                return None  # not continued as new yet
            page = await client.get_workflow_handle(wid).query("changes", PageRequest(), result_type=WatchPage)
            return page if page.watched == N_WATCHES and not page.adopting else None
        page = await _eventually(watched_all, "the watcher continued as new and its new run adopted every watch")
        assert page.more  # the reply is a page, not the whole set

        ended_at = asyncio.get_running_loop().time()
        iris.set_state(ended, "succeeded")
        got = await asyncio.wait_for(receiver.result(), 120)

        async def dropped() -> bool:
            page = await client.get_workflow_handle(wid).query("changes", PageRequest(), result_type=WatchPage)
            return page.watched == N_WATCHES - 1
        await _eventually(dropped, "the delivered job dropped from the watch set")
        await client.get_workflow_handle(wid).terminate("test over")

    assert got.job_id == ended and got.terminal and got.state == "succeeded"
    # Every payload seen by the worker and the client (queries, heartbeats, signals, continue-as-new).
    assert sizes.count > N_WATCHES
    assert 0 < sizes.largest < LIMIT, sizes.largest
    # The continue-as-new input names the previous run; it does not carry the 1,500 watches.
    first = client.get_workflow_handle(wid, run_id=first_run)
    events = [e async for e in first.fetch_history_events()]
    can = [e for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW]
    assert can and sum(p.ByteSize() for p in can[0].workflow_execution_continued_as_new_event_attributes
                       .input.payloads) < 4096
    # Markers are held once per build contract: a page of hundreds of jobs carries one marker set.
    assert len(page.marker_sets) == 1 and len(page.watches) > 100
    assert all(not w.markers for w in page.watches)
    # The Iris side: one status request per poll for all jobs (GetJobState, or a ListJobs listing when the
    # details are due: either may be the one that sees the end). The end costs no detail read when a
    # GetJobState poll saw it (its state is taken as the poll reported it), one GetJobStatus when a listing
    # did (a job that changed alone), once more only by a watch activity that started after it (a
    # continue-as-new or a stall under load: it rebuilds from the workflow, which may not have recorded the
    # end yet); never per poll.
    restarted = sum(1 for t in starts if t > ended_at)
    readers = [(caller, round(t - ended_at, 2)) for method, caller, t in iris.calls if method == "GetJobStatus"]
    polls = iris.requests["GetJobState"] + iris.requests["ListJobs"]
    assert polls >= 1 and iris.requests["GetJobStatus"] <= 1 + restarted, \
        (iris.requests, "starts after the end:", [round(t - ended_at, 2) for t in starts], "end read by:", readers)


async def _eventually(predicate, what: str, attempts: int = 600, interval: float = 0.2):
    for _ in range(attempts):
        value = await predicate()
        if value:
            return value
        await asyncio.sleep(interval)
    raise AssertionError(f"gave up waiting for {what}")


async def test_an_activity_of_a_run_that_continued_as_new_polls_nothing(temporal_client, tmp_path):
    """A watch attempt started just before its run continued as new reads the watch set from the newer run:
    it returns at once, with no request to Iris (its cancellation would reach it only on a heartbeat reply,
    and until then two watchers would read and signal every change)."""
    run = uuid.uuid4().hex[:8]
    cluster, tq = f"superseded-{run}", f"tq-superseded-{run}"
    job = f"/runner/superseded-{run}"
    iris = StandinJobs({job: "running"})
    watch = WatchActivities(_config(tmp_path, cluster), transport=iris)
    req = WatchRequest(job_id=job, workflow_id=f"gone-{run}", registered_at="2026-12-01T00:00:00+00:00",
                       known=JobProgress(job_id=job, state="running", terminal=False))
    async with Worker(temporal_client, task_queue=tq, workflows=[SupersededWatcher],
                      activities=[watch.watch_cluster]):
        got = await asyncio.wait_for(temporal_client.execute_workflow(
            SupersededWatcher.run, args=[cluster, req], id=f"superseded-{run}", task_queue=tq), 60)
    assert got.polls == 0 and not iris.calls, (got, iris.calls)


async def test_a_stalled_watcher_is_replaced_and_the_end_still_delivered(temporal_client, tmp_path):
    """A request that never answers is bounded (the job is shown unreachable and read again); a worker
    whose loop is starved (the poll that sees a job's end blocks the event loop for 15 s) stops
    heartbeating: Temporal starts a fresh attempt after one heartbeat timeout (the old one ends itself as
    stalled once it runs again), the new attempt rebuilds from the workflow, and the end is delivered."""
    run = uuid.uuid4().hex[:8]
    cluster, tq = f"stall-{run}", f"tq-stall-{run}"
    job_ids = [f"/runner/stall-{run}-{i}" for i in range(3)]
    iris = StandinJobs({j: "running" for j in job_ids})
    receiver_id, ended = f"receiver-{run}", job_ids[1]
    wid = watcher_id(cluster, tq)
    watch = WatchActivities(_config(tmp_path, cluster), transport=iris)
    async with Worker(temporal_client, task_queue=tq, workflows=[IrisWatcherWorkflow, EndReceiver],
                      activities=[watch.watch_cluster]):
        receiver = await temporal_client.start_workflow(EndReceiver.run, id=receiver_id, task_queue=tq)
        for i, j in enumerate(job_ids):
            await temporal_client.start_workflow(
                IrisWatcherWorkflow.run, WatcherInput(cluster=cluster), id=wid, task_queue=tq,
                start_signal="watch", start_signal_args=[WatchRequest(
                    job_id=j, workflow_id=receiver_id if j == ended else f"gone-{run}-{i}",
                    registered_at="2026-12-01T00:00:00+00:00",
                    known=JobProgress(job_id=j, state="running", terminal=False))],
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING)

        async def polling() -> bool:
            return iris.requests["GetJobState"] > 0
        await _eventually(polling, "the watcher polls")
        iris.stall_once = {"GetJobState": 60.0}  # bounded by the poll deadline: not a stall
        await _eventually(lambda: _async(not iris.stall_once), "the hung request")
        iris.set_state(ended, "succeeded")
        iris.block_once = {"GetJobState": 15.0}  # the poll that sees the end (ends need no detail read)
        got = await asyncio.wait_for(receiver.result(), 120)
        for j in job_ids:
            iris.set_state(j, "succeeded")  # the rest end too: the watcher completes and its history closes
        await asyncio.wait_for(temporal_client.get_workflow_handle(wid).result(), 120)
        events = [e async for e in temporal_client.get_workflow_handle(wid).fetch_history_events()]

    assert got.job_id == ended and got.terminal
    started = [e.activity_task_started_event_attributes for e in events
               if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED]
    assert any(s.attempt >= 2 and ("stalled" in s.last_failure.message or "eartbeat" in s.last_failure.message)
               for s in started), [(s.attempt, s.last_failure.message) for s in started]


async def _async(value):
    return value
