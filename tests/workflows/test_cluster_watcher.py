"""The real cluster watcher end to end: real TargetBuildWorkflows (other activities scripted) whose jobs
run on the real local Iris controller, the real IrisWatcherWorkflow and watch activities, the Temporal
dev server. One GetJobState per poll serves every running target; targets schedule no activity while
their job runs; the watcher ends once nothing is left to watch.

Requests are counted on the wire by a recording httpx transport."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import uuid

from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus
from temporalio.worker import Worker

from activities.watch import WatchActivities
from clients.iris import IrisClient
from domain.config import PolicySettings, ServiceConfig
from domain.models import SubmitInput, SubmittedJob, TargetResult
from domain.watch import watcher_id, watcher_task_queue
from tests.iris.helpers import bash_spec
from tests.iris.test_cluster_watch import RecordingTransport
from tests.workflows.standins import Standins, eventually, plan, result, target_input
from workflows.target import TargetBuildWorkflow
from workflows.watcher import IrisWatcherWorkflow

N_TARGETS = 4
POLICY = PolicySettings(watch_interval_s=0.5, watch_fast_interval_s=0.5, watch_idle_interval_s=0.5,
                        watch_status_budget_per_min=600, watch_log_interval_s=2.0, watch_progress_interval_s=2.0,
                        monitor_safety_interval_s=600)


@contextlib.asynccontextmanager
async def _workers(client, tq: str, activities: list, watch: WatchActivities):
    """The production pair of workers (worker.py build_worker): the targets' queue with the scripted activities and
    ``watch_job``, and the watcher's own queue with the watcher workflow and its poll."""
    async with Worker(client, task_queue=tq, workflows=[TargetBuildWorkflow, IrisWatcherWorkflow],
                      activities=[*activities, *watch.all()]), \
            Worker(client, task_queue=watcher_task_queue(tq), workflows=[IrisWatcherWorkflow],
                   activities=[watch.watch_cluster]):
        yield


class RealJobs(Standins):
    """submit_job launches a real job on the controller (runs ~3 s, prints a build marker)."""

    def __init__(self, iris: IrisClient, **kw):
        super().__init__(policy=POLICY, **kw)
        self.iris = iris

    @activity.defn(name="submit_job")
    async def submit_job(self, inp: SubmitInput) -> SubmittedJob:
        await self._enter("submit_job", inp)
        job_id = f"/tester/{inp.request_id}"
        self._jobs[job_id] = (inp.target.key, inp.round)
        marker = next(m.text for m in inp.target.expected_markers if m.text)
        await self.iris.submit_idempotent(bash_spec(job_id, f"sleep 1; echo '{marker}'; sleep 2"))
        return SubmittedJob(job_id=job_id, cluster=inp.target.cluster, attached=False, submitted_at_ms=1)


def _config(tmp_path, cluster: str, url: str) -> ServiceConfig:
    return ServiceConfig.model_validate({
        "work_dir": str(tmp_path),
        "repos": {"marinskyrl_url": "file:///nowhere", "harbor_url": "file:///nowhere"},
        "clusters": {cluster: {"controller_url": url, "client_revision_date": datetime.date.today().isoformat()}},
        "registry": {"image_repository": "127.0.0.1:5000/gpu-rl", "user": {"kind": "literal_public", "value": "u"}, "token": {"kind": "env", "name": "X"}},
        "policy": POLICY.model_dump(),
    })


async def test_one_watcher_serves_every_running_target_with_one_request_per_poll(
        temporal_client, iris_controller, tmp_path):
    run = uuid.uuid4().hex[:8]
    cluster, tq = f"watch-{run}", f"tq-watch-{run}"
    recorder = RecordingTransport()
    iris = IrisClient(iris_controller.url, client_revision_date=datetime.date.today().isoformat())
    s = RealJobs(iris)
    target = plan()[0].model_copy(update={"cluster": cluster})
    watch = WatchActivities(_config(tmp_path, cluster, iris_controller.url), transport=recorder)
    activities = [a for a in s.all() if getattr(a, "__temporal_activity_definition").name != "watch_job"]
    try:
        async with _workers(temporal_client, tq, activities, watch):
            handles = [await temporal_client.start_workflow(
                TargetBuildWorkflow.run, target_input(f"w{run}-{i}", target), id=f"w{run}-{i}", task_queue=tq)
                for i in range(N_TARGETS)]
            results: list[TargetResult] = await asyncio.gather(*(result(h, timeout=120) for h in handles))
            watcher = temporal_client.get_workflow_handle(watcher_id(cluster, tq))

            async def watcher_closed():
                return (await watcher.describe()).status == WorkflowExecutionStatus.COMPLETED
            await eventually(watcher_closed, what="the watcher ends when nothing is left to watch", attempts=600)
    finally:
        await iris.aclose()
        await recorder.aclose()

    assert [r.status for r in results] == ["validated"] * N_TARGETS
    # Each target: registered once, woken by the watcher; no activity while its job ran.
    for h in handles:
        names = [e.activity_task_scheduled_event_attributes.activity_type.name
                 for e in (await h.fetch_history()).events
                 if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED]
        assert names == ["policy", "submit_job", "watch_job", "check_build_log", "validate_image"], names
    # The watcher: one GetJobState per poll for all targets together; no status read per registration
    # (watch_job asks the controller nothing), at most one per change, never per target per interval.
    polls = 0
    for e in (await watcher.fetch_history()).events:
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            (res,) = await temporal_client.data_converter.decode(e.activity_task_completed_event_attributes.result.payloads)
            polls += res["polls"] if isinstance(res, dict) else res.polls
    assert polls >= 2
    assert recorder.requests["GetJobState"] <= polls  # polls with nothing to watch send nothing
    # Per job: at most one per observed change (pending → running → succeeded, and at most one more when a
    # tick catches the job between two states); never one per poll (polls × N), none at registration.
    reads_per_job = 3
    assert recorder.requests["GetJobStatus"] <= N_TARGETS * reads_per_job < N_TARGETS * polls
    assert recorder.requests["FetchLogs"] <= N_TARGETS * 4  # 3 s jobs, a 2 s progress cadence


class GatedJobs(RealJobs):
    """The job prints its build marker, then runs until the gate file exists."""

    def __init__(self, iris: IrisClient, gate: str, **kw):
        super().__init__(iris, **kw)
        self.gate = gate

    @activity.defn(name="submit_job")
    async def submit_job(self, inp: SubmitInput) -> SubmittedJob:
        await self._enter("submit_job", inp)
        job_id = f"/tester/{inp.request_id}"
        self._jobs[job_id] = (inp.target.key, inp.round)
        marker = next(m.text for m in inp.target.expected_markers if m.text)
        await self.iris.submit_idempotent(bash_spec(
            job_id, f"echo '{marker}'; while [ ! -e {self.gate} ]; do sleep 0.2; done"))
        return SubmittedJob(job_id=job_id, cluster=inp.target.cluster, attached=False, submitted_at_ms=1)


async def test_follow_shows_the_watchers_live_progress_and_leases_the_fast_log_cadence(
        temporal_client, iris_controller, tmp_path):
    """The target is not woken for a marker (progress wake-ups are rate-limited), yet a follower sees it:
    ``WatchedProgress`` reads the watcher's heartbeat and asks it to read the log at the follow cadence."""
    from activities.watch import WatchedProgress

    run = uuid.uuid4().hex[:8]
    cluster, tq, gate = f"follow-{run}", f"tq-follow-{run}", str(tmp_path / "gate")
    policy = POLICY.model_copy(update={"watch_progress_interval_s": 3600.0, "watch_follow_interval_s": 0.5,
                                       "watch_signal_progress_s": 3600.0})
    iris = IrisClient(iris_controller.url, client_revision_date=datetime.date.today().isoformat())
    s = GatedJobs(iris, gate)
    target = plan()[0].model_copy(update={"cluster": cluster})
    marker = next(m.text for m in target.expected_markers if m.text)
    config = _config(tmp_path, cluster, iris_controller.url).model_copy(update={"policy": policy})
    activities = [a for a in s.all() if getattr(a, "__temporal_activity_definition").name != "watch_job"]
    live = WatchedProgress(temporal_client, tq)
    try:
        watch = WatchActivities(config)
        async with _workers(temporal_client, tq, activities, watch):
            h = await temporal_client.start_workflow(TargetBuildWorkflow.run, target_input(f"f{run}", target),
                                                     id=f"f{run}", task_queue=tq)

            async def followed_marker():
                st = await h.query(TargetBuildWorkflow.status)
                if st.progress is None or st.progress.state != "running":
                    return None
                statuses = {target.key: st}
                await live.overlay({target.key: cluster}, statuses)
                return statuses[target.key] if statuses[target.key].progress.last_marker == marker else None
            seen = await eventually(followed_marker, what="the marker through the watcher", attempts=600)
            own = (await h.query(TargetBuildWorkflow.status)).progress
            ws = await temporal_client.get_workflow_handle(watcher_id(cluster, tq)).query(IrisWatcherWorkflow.watched)
            open(gate, "w").close()
            res = await result(h, timeout=120)
    finally:
        open(gate, "w").close()
        await iris.aclose()

    assert seen.progress.last_marker == marker and seen.progress.state == "running"
    assert own.last_marker != marker  # the target itself was not woken for it (history stays small)
    assert list(ws.following) == [seen.progress.job_id]
    assert res.status == "validated"


class FailingJobs(GatedJobs):
    """The job prints its build marker, runs until the gate file exists, then fails (no marker announces it)."""

    @activity.defn(name="submit_job")
    async def submit_job(self, inp: SubmitInput) -> SubmittedJob:
        await self._enter("submit_job", inp)
        job_id = f"/tester/{inp.request_id}-{inp.round}"
        self._jobs[job_id] = (inp.target.key, inp.round)
        await self.iris.submit_idempotent(bash_spec(
            job_id, f"echo started; while [ ! -e {self.gate} ]; do sleep 0.2; done; exit 3"))
        return SubmittedJob(job_id=job_id, cluster=inp.target.cluster, attached=False, submitted_at_ms=1)


async def test_the_watcher_polls_when_the_controllers_audit_line_names_an_end_not_at_its_regular_cadence(
        temporal_client, iris_controller, tmp_path):
    """The whole loop (``watch_cluster``): at 3 status requests a minute the regular poll comes every 20 s; a
    job that fails mid-run is read as soon as the controller's audit line names it, and the watcher's own
    record (its heartbeat's ``feed``) says that poll was the feed's."""
    from activities.watch import watcher_view

    run = uuid.uuid4().hex[:8]
    cluster, tq, gate = f"feed-{run}", f"tq-feed-{run}", str(tmp_path / "gate")
    policy = POLICY.model_copy(update={"watch_status_budget_per_min": 3, "watch_progress_interval_s": 3600.0,
                                       "watch_signal_progress_s": 3600.0})
    recorder = RecordingTransport()
    iris = IrisClient(iris_controller.url, client_revision_date=datetime.date.today().isoformat())
    s = FailingJobs(iris, gate)
    target = plan()[0].model_copy(update={"cluster": cluster})
    config = _config(tmp_path, cluster, iris_controller.url).model_copy(update={"policy": policy})
    activities = [a for a in s.all() if getattr(a, "__temporal_activity_definition").name != "watch_job"]
    job_id = f"/tester/e{run}-0"
    try:
        watch = WatchActivities(config, transport=recorder)
        async with _workers(temporal_client, tq, activities, watch):
            h = await temporal_client.start_workflow(TargetBuildWorkflow.run, target_input(f"e{run}", target),
                                                     id=f"e{run}", task_queue=tq)

            async def feed_proven():
                view = await watcher_view(temporal_client, cluster, tq)
                feed = (view or {}).get("feed") or {}
                return view if feed.get("state") == "ok" and view.get("polls", 0) >= 1 else None
            before = await eventually(feed_proven, what="the watcher polling with a proven feed", attempts=1200)
            open(gate, "w").close()  # the job fails now

            last: list = [None]

            async def end_seen():
                view = last[0] = await watcher_view(temporal_client, cluster, tq)
                return view if job_id in ((view or {}).get("feed") or {}).get("woke", []) else None
            try:
                after = await eventually(end_seen, what="the end read through the feed", attempts=1200)
            except AssertionError:
                raise AssertionError(f"the end of {job_id} was not read through the feed; the watcher's last "
                                     f"heartbeat: {last[0]}; jobs submitted: {list(s._jobs)}") from None
            await h.terminate("test over")
    finally:
        open(gate, "w").close()
        await iris.aclose()
        await recorder.aclose()

    feed = after["feed"]
    assert feed["seen_early"] >= 1 and feed["early_polls"] >= 1, feed
    assert feed["misses"] == 0 and feed["disagreements"] == 0, feed
    # ``woke`` lists only ends found by a poll the feed brought forward (before the regular one was due).
    assert before["feed"]["woke"] == [] and after["feed"]["woke"] == [job_id], (before["feed"], feed)
    assert feed["requests"] >= 1 and recorder.requests["FetchLogs(feed)"] >= feed["requests"]
