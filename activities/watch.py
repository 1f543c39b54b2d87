"""The per-cluster Iris watcher: one request per interval for every running job, targets woken on change.

Why a long-lived heartbeating activity (run by ``workflows/watcher.py``) rather than a workflow that
polls with a timer: the poll loop keeps its state (what each target was last told, the log cursors,
the Iris client and, for tunnelled clusters, one kubectl port-forward) in memory for its whole life,
and a poll that finds nothing new costs no history event at all — only a heartbeat. The workflow
holds the durable part (who watches which job) and restarts the activity after a crash; the
activity's heartbeat details carry its small resume state and the live progress of every job (the
Temporal UI shows them on the watcher workflow, ``starter.py follow`` reads them).

Per interval (``policy.watch_interval_s``, a fixed cadence): one status request for every watched
job — ``GetJobState`` with all ids, or every ``watch_progress_interval_s`` instead ``ListJobs`` per
(user prefix, state), which also brings pending reasons and preemption counts — and a ``GetJobStatus``
(no tasks) only for a job whose state changed. Per job, every ``watch_progress_interval_s`` (or
``watch_follow_interval_s`` while someone follows it): one ``FetchLogs`` page from its cursor for the
latest build marker.

Guarantees kept from per-target polling: an unreachable controller is never terminal (the job keeps
its last known state, marked unreachable); a job absent from ``GetJobState`` is confirmed with
``GetJobStatus`` before it is reported missing, and missing is never success (the target lets the
registry decide).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
from temporalio import activity
from temporalio.client import Client
from temporalio.common import WorkflowIDReusePolicy
from temporalio.service import RPCError, RPCStatusCode

from activities.build import _progress, _scan_markers
from activities.common import HEARTBEAT_EVERY_S, ActivityGroup, Heartbeater, iris_client
from clients.iris import IrisClient, JobState, NotFound, Unavailable
from domain.config import PolicySettings, ServiceConfig
from domain.models import JobProgress
from domain.watch import (
    FollowRequest,
    WatchClusterInput,
    WatchClusterResult,
    WatcherInput,
    WatchJobInput,
    WatchRequest,
    WatchSet,
    should_wake,
    user_prefix,
    watcher_id,
)

JOB_CHANGED_SIGNAL = "job_changed"  # TargetBuildWorkflow.job_changed
LOG_FETCH_CONCURRENCY = 4  # the controller serves at most 4 FetchLogs at once
DETAIL_CONCURRENCY = 8  # GetJobStatus of jobs that changed in the same tick
SIGNAL_CONCURRENCY = 16  # wake-ups sent at once


@dataclass
class Tracked:
    """One watched job as the watcher sees it."""

    request: WatchRequest
    now: JobProgress  # the latest observation
    told: JobProgress  # what the target was last told (or told us it knows)
    cursor: int = 0  # FetchLogs cursor (exclusive)
    told_at: float = 0.0  # monotonic time of the last wake-up sent
    progress_at: float = float("-inf")  # monotonic time of the last progress refresh
    detail_needed: bool = False  # fetch GetJobStatus on the next poll even if the state looks unchanged


@dataclass
class ClusterWatch:
    """The watcher's loop body, Temporal-free: ``sync`` the watch set, ``poll``, ``refresh`` progress,
    then ``wakeups`` says which targets to signal. Tests drive it directly against a real controller."""

    policy: PolicySettings
    jobs: dict[str, Tracked] = field(default_factory=dict)
    following: dict[str, float] = field(default_factory=dict)
    clock: Callable[[], float] = time.monotonic
    details_at: float = float("-inf")  # when the last ListJobs poll (with pending reasons, preemptions) ran

    # ---------------------------------------------------------------- watch set
    def sync(self, ws: WatchSet) -> None:
        """Adopt the workflow's watch set: add new jobs, drop removed ones; a re-registration (new
        ``registered_at``) resets what the target is known to know, so anything it missed is re-sent."""
        wanted = {w.job_id: w for w in ws.watches}
        for job_id in list(self.jobs):
            if job_id not in wanted:
                del self.jobs[job_id]
        for job_id, req in wanted.items():
            t = self.jobs.get(job_id)
            if t is None:
                # watch_job has just read the job's status: no second read unless it did not get one.
                self.jobs[job_id] = Tracked(request=req, now=req.known.model_copy(), told=req.known.model_copy(),
                                            told_at=self.clock(), detail_needed=req.known.state == "unknown",
                                            progress_at=self.clock() - self._phase(job_id))
            elif t.request.registered_at != req.registered_at:
                t.request, t.told, t.told_at = req, req.known.model_copy(), self.clock()
        self.following = dict(ws.following)

    def _phase(self, job_id: str) -> float:
        """A fixed per-job offset within the progress interval: the first log read of each job comes
        within one interval of its registration, and the reads of many jobs are spread evenly instead of
        hitting the controller all at once every minute."""
        return self.policy.watch_progress_interval_s * (zlib.crc32(job_id.encode()) / 2**32)

    # ---------------------------------------------------------------- one poll (one request)
    async def poll(self, iris: IrisClient) -> None:
        """One status request for every watched job: ``GetJobState`` with all ids, or — when the details
        are due (every ``watch_progress_interval_s``) — ``ListJobs`` per (user prefix, state), which also
        brings pending reasons and preemption counts. A job whose state differs (or is absent) gets one
        ``GetJobStatus``: details are read per change, never per job per interval."""
        ids = [j for j, t in self.jobs.items() if not t.told.terminal]
        if not ids:
            return
        now = self.clock()
        if now - self.details_at >= self.policy.watch_progress_interval_s:
            await self._poll_listing(iris, ids)
            self.details_at = now
            return
        try:
            states = await iris.job_states(ids)
        except Unavailable as e:
            for j in ids:
                self._unreachable(j, e)
            return
        await self._read_details(iris, [
            j for j in ids if (state := states.get(j)) is None or state.value != self.jobs[j].now.state
            or self.jobs[j].detail_needed or not self.jobs[j].now.controller_reachable])

    async def _poll_listing(self, iris: IrisClient, ids: list[str]) -> None:
        wanted = sorted({(user_prefix(j), self.jobs[j].now.state) for j in ids
                         if self.jobs[j].now.state in (JobState.PENDING.value, JobState.RUNNING.value)})
        listed = {}
        for prefix, state in wanted:
            try:
                listed.update((i.job_id, i) for i in await iris.list_jobs(prefix=prefix, state=state, limit=5000))
            except Unavailable as e:
                for j in ids:
                    self._unreachable(j, e)
                return
        changed = []
        for j in ids:
            t, info = self.jobs[j], listed.get(j)
            if info is not None and info.state.value == t.now.state and not t.detail_needed \
                    and t.now.controller_reachable:
                t.now = _progress(info, t.now)
            else:  # not listed under the state we knew: it changed (or vanished); read it
                changed.append(j)
        await self._read_details(iris, changed)

    async def _read_details(self, iris: IrisClient, job_ids: list[str]) -> None:
        """GetJobStatus for the jobs that changed, a few at once (many jobs can end in the same tick)."""
        sem = asyncio.Semaphore(DETAIL_CONCURRENCY)

        async def one(j: str) -> None:
            async with sem:
                await self._details(iris, j)
        await asyncio.gather(*(one(j) for j in job_ids))

    async def _details(self, iris: IrisClient, job_id: str) -> None:
        t = self.jobs[job_id]
        try:
            info = await iris.job_status(job_id, with_tasks=False)
            t.now = _progress(info, t.now)
            t.detail_needed = False
        except NotFound:
            t.now = t.now.model_copy(update=dict(
                state="missing", terminal=True, missing=True, controller_reachable=True,
                error=f"{job_id} is no longer known to the controller (pruned?); not a success"))
            t.detail_needed = False
        except Unavailable as e:
            self._unreachable(job_id, e)

    def _unreachable(self, job_id: str, err: Exception) -> None:
        t = self.jobs[job_id]
        t.now = t.now.model_copy(update=dict(controller_reachable=False, error=f"controller unreachable: {err}"))

    # ---------------------------------------------------------------- log progress (slower cadence)
    def _logs_due(self, job_id: str, now: float) -> bool:
        t = self.jobs[job_id]
        every = (self.policy.watch_follow_interval_s if self.following.get(job_id, 0) > time.time()
                 else self.policy.watch_progress_interval_s)
        return (t.now.state == JobState.RUNNING.value and bool(t.request.markers) and not t.told.terminal
                and now - t.progress_at >= every)

    async def refresh(self, iris: IrisClient) -> None:
        """The latest build marker of each running job whose log read is due: one ``FetchLogs`` page
        from its cursor (a page short of the limit is the end), at most 4 at once."""
        now = self.clock()
        due = [j for j in self.jobs if self._logs_due(j, now)]
        sem = asyncio.Semaphore(LOG_FETCH_CONCURRENCY)

        async def scan(j: str) -> None:
            t = self.jobs[j]
            t.progress_at = now
            async with sem:
                try:
                    t.cursor, marker = await _scan_markers(iris, j, t.cursor, t.now.last_marker, t.request.markers)
                except Unavailable:
                    return
            t.now = t.now.model_copy(update=dict(last_marker=marker, log_cursor=t.cursor))

        await asyncio.gather(*(scan(j) for j in due))

    # ---------------------------------------------------------------- who to wake
    def wakeups(self) -> list[tuple[str, JobProgress]]:
        now = self.clock()
        return [(t.request.workflow_id, t.now) for t in self.jobs.values()
                if should_wake(t.told, t.now, since_last_wake_s=now - t.told_at,
                               progress_signal_s=self.policy.watch_signal_progress_s)]

    def told(self, job_id: str, progress: JobProgress) -> None:
        t = self.jobs.get(job_id)
        if t is not None:
            t.told, t.told_at = progress.model_copy(), self.clock()

    def finished(self) -> list[str]:
        """Jobs whose terminal state the target has been told: nothing more to watch."""
        return [j for j, t in self.jobs.items() if t.told.terminal]

    # ---------------------------------------------------------------- resume state
    def details(self) -> dict:
        """Heartbeat details: per job what the target was told, the log cursor and the live progress."""
        return {"jobs": {j: {"registered_at": t.request.registered_at, "cursor": t.cursor,
                             "told": t.told.model_dump(mode="json"), "now": t.now.model_dump(mode="json")}
                         for j, t in self.jobs.items()}}

    def resume(self, details: dict | None, ws: WatchSet) -> None:
        """Start from the last heartbeat of a crashed attempt: targets are not told twice, logs are not
        re-read from 0 (a registration newer than the heartbeat wins)."""
        self.sync(ws)
        for j, d in ((details or {}).get("jobs") or {}).items():
            t = self.jobs.get(j)
            if t is None or d.get("registered_at") != t.request.registered_at:
                continue
            t.cursor = int(d.get("cursor") or 0)
            t.told = JobProgress.model_validate(d["told"])
            t.now = JobProgress.model_validate(d["now"])


class WatchActivities(ActivityGroup):
    """``watch_job`` (per target, once per job and per safety interval) and ``watch_cluster`` (the loop)."""

    def __init__(self, config: ServiceConfig, *, transport: httpx.AsyncBaseTransport | None = None):
        super().__init__(config)
        self._transport = transport  # e.g. a recording transport in tests; None: plain HTTP

    def all(self) -> list:
        return [self.watch_job, self.watch_cluster]

    @activity.defn
    async def watch_job(self, inp: WatchJobInput) -> JobProgress:
        """Read the job's state now and register it with its cluster's watcher (signal-with-start: the
        watcher is started when none runs). Idempotent: a re-registration replaces the previous one.

        A safety re-check (``known`` set) first looks at the watcher's heartbeat: when the watcher is
        alive and has told this target what it knows, the watcher's live progress is returned and the
        controller is not asked at all (so safety re-checks cost no Iris request)."""
        if inp.known is not None:
            seen = await _watched_progress(activity.client(), inp.cluster, activity.info().task_queue, inp.job_id,
                                           inp.known)
            if seen is not None:
                return seen
        progress = (inp.known or JobProgress(job_id=inp.job_id, state="unknown", terminal=False)).model_copy()
        async with iris_client(self.config, inp.cluster, transport=self._transport) as iris:
            try:
                progress = _progress(await iris.job_status(inp.job_id, with_tasks=False), progress)
            except NotFound:
                progress = progress.model_copy(update=dict(
                    state="missing", terminal=True, missing=True, controller_reachable=True,
                    error=f"{inp.job_id} is no longer known to the controller (pruned?); not a success"))
            except Unavailable as e:
                progress = progress.model_copy(update=dict(controller_reachable=False,
                                                           error=f"controller unreachable: {e}"))
        if progress.terminal:
            return progress  # nothing to watch
        request = WatchRequest(job_id=inp.job_id, workflow_id=inp.workflow_id, markers=inp.markers, known=progress,
                               registered_at=inp.registered_at)
        await activity.client().start_workflow(
            "IrisWatcherWorkflow", WatcherInput(cluster=inp.cluster), id=watcher_id(inp.cluster, activity.info().task_queue),
            task_queue=activity.info().task_queue, start_signal="watch", start_signal_args=[request],
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            static_summary=f"Iris watcher for cluster {inp.cluster}: one status request per interval for every "
                           "running job, targets woken on change")
        return progress

    @activity.defn
    async def watch_cluster(self, inp: WatchClusterInput) -> WatchClusterResult:
        """Poll every watched job of the cluster until none is left (or ``return_after_s``); wake targets.

        Ends when the watch set stays empty for two intervals, when the worker shuts down (the workflow
        starts it again elsewhere) or after ``return_after_s``."""
        pol = self.config.policy
        client = activity.client()
        me = client.get_workflow_handle(activity.info().workflow_id)
        engine = ClusterWatch(pol)
        result = WatchClusterResult()
        ws = await me.query("watched", result_type=WatchSet)
        details = activity.info().heartbeat_details
        engine.resume(details[0] if details else None, ws)
        async with Heartbeater(HEARTBEAT_EVERY_S) as beat, \
                iris_client(self.config, inp.cluster, transport=self._transport) as iris:
            # Heartbeats go out in the background (a slow poll never looks like a dead worker) and carry
            # the latest resume state and live progress.
            beat.details = {**engine.details(), "polls": 0, "requests": {}}
            logs = asyncio.create_task(_read_logs(engine, iris, pol.watch_interval_s))
            try:
                return await self._poll_loop(inp, engine, iris, beat, me, client, result)
            finally:
                logs.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await logs

    async def _poll_loop(self, inp: WatchClusterInput, engine: ClusterWatch, iris: IrisClient, beat: Heartbeater,
                         me, client: Client, result: WatchClusterResult) -> WatchClusterResult:
        pol = self.config.policy
        started, empty_polls = time.monotonic(), 0
        next_poll = time.monotonic()
        while True:
            # Poll and wake first, on a fixed cadence: the detection delay is at most one interval.
            await engine.poll(iris)
            result.signals += await _wake(client, engine)
            finished = engine.finished()
            if finished:
                with contextlib.suppress(RPCError):
                    await me.signal("unwatch", finished)
            result.polls += 1
            result.requests = dict(iris.requests)
            beat.details = {**engine.details(), "polls": result.polls, "requests": result.requests}
            if time.monotonic() - started >= inp.return_after_s or activity.is_worker_shutdown():
                return result
            try:
                ws = await me.query("watched", result_type=WatchSet)
            except RPCError as e:
                activity.logger.warning(f"watch set not readable, keeping the last one: {e}")
            else:
                engine.sync(ws)
            empty_polls = empty_polls + 1 if not engine.jobs else 0
            if empty_polls >= 2:
                return result
            next_poll = max(next_poll + pol.watch_interval_s, time.monotonic())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(activity.wait_for_worker_shutdown(), next_poll - time.monotonic())


async def _read_logs(engine: ClusterWatch, iris: IrisClient, every_s: float) -> None:
    """Log reads run beside the poll loop: hundreds of due reads never delay a status poll (a new marker is
    picked up by the next poll's wake-ups)."""
    while True:
        try:
            await engine.refresh(iris)
        except Exception as e:  # noqa: BLE001 - progress only: never stop watching over a log read
            activity.logger.warning(f"log progress read failed: {e}")
        await asyncio.sleep(every_s)


async def _wake(client: Client, engine: ClusterWatch) -> int:
    """Signal each target with something new; a target that no longer runs is dropped, a transient
    failure is retried on the next poll (the target is not marked as told)."""
    sem = asyncio.Semaphore(SIGNAL_CONCURRENCY)

    async def one(workflow_id: str, progress: JobProgress) -> int:
        async with sem:
            try:
                await client.get_workflow_handle(workflow_id).signal(JOB_CHANGED_SIGNAL, progress)
            except RPCError as e:
                if e.status == RPCStatusCode.NOT_FOUND:  # closed target: nobody to tell any more
                    engine.told(progress.job_id, progress.model_copy(update={"terminal": True}))
                else:
                    activity.logger.warning(f"could not wake {workflow_id} about {progress.job_id}: {e}")
                return 0
        engine.told(progress.job_id, progress)
        return 1
    return sum(await asyncio.gather(*(one(w, p) for w, p in engine.wakeups())))


HEARTBEAT_FRESH_S = 60.0  # a watcher whose last heartbeat is older than this is presumed stuck or dead


async def watcher_view(client: Client, cluster: str, task_queue: str) -> dict | None:
    """The running watcher's latest heartbeat details (``{"jobs": {job_id: {"told", "now", ...}}}``), or
    None when no watcher runs or its heartbeat is stale. Reads Temporal only, never the controller."""
    try:
        desc = await client.get_workflow_handle(watcher_id(cluster, task_queue)).describe()
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    for pending in desc.raw_description.pending_activities:
        if pending.activity_type.name != "watch_cluster" or not pending.heartbeat_details.payloads:
            continue
        if not pending.HasField("last_heartbeat_time"):
            continue
        age = time.time() - pending.last_heartbeat_time.ToMicroseconds() / 1e6
        if age > HEARTBEAT_FRESH_S:
            return None
        (details,) = await client.data_converter.decode(pending.heartbeat_details.payloads[:1])
        return details if isinstance(details, dict) else None
    return None


async def _watched_progress(client: Client, cluster: str, task_queue: str, job_id: str,
                            known: JobProgress) -> JobProgress | None:
    """The watcher's live progress of ``job_id`` if the watcher is alive and agrees with the target on
    what it was told (state, terminal, missing); None when anything may have been lost."""
    view = await watcher_view(client, cluster, task_queue)
    entry = ((view or {}).get("jobs") or {}).get(job_id)
    if not entry:
        return None
    told, now = JobProgress.model_validate(entry["told"]), JobProgress.model_validate(entry["now"])
    if (told.state, told.terminal, told.missing) != (known.state, known.terminal, known.missing):
        return None
    return now


FOLLOW_LEASE_S = 300.0  # a follower asks again every FOLLOW_LEASE_S / 2: the fast log cadence ends with it


class WatchedProgress:
    """Client side (``starter.py follow``): the live progress of running targets from their cluster
    watcher's heartbeat, and a follow lease so the watcher reads those jobs' logs at the follow cadence.

    A target's own status only changes when the watcher wakes it (rarely, by design); the watcher's
    heartbeat has the latest marker, pending reason and elapsed time. Reads Temporal only."""

    def __init__(self, client: Client, task_queue: str):
        self.client = client
        self.task_queue = task_queue  # the workers' queue: its watchers are the ones to read
        self._leased: dict[str, float] = {}  # job id -> when the lease was last sent (epoch s)

    async def overlay(self, clusters: dict[str, str], statuses: dict) -> None:
        """``clusters``: target key -> cluster; ``statuses``: target key -> TargetStatus (updated in place)."""
        running = {k: s for k, s in statuses.items()
                   if s is not None and s.progress is not None and not s.progress.terminal and k in clusters}
        views: dict[str, dict | None] = {}
        for key, st in running.items():
            cluster = clusters[key]
            if cluster not in views:
                try:
                    views[cluster] = await watcher_view(self.client, cluster, self.task_queue)
                except RPCError:
                    views[cluster] = None
            entry = ((views[cluster] or {}).get("jobs") or {}).get(st.progress.job_id)
            if entry:
                st.progress = JobProgress.model_validate(entry["now"])
        now = time.time()
        due: dict[str, list[str]] = {}
        for key, st in running.items():
            if now - self._leased.get(st.progress.job_id, 0.0) >= FOLLOW_LEASE_S / 2:
                due.setdefault(clusters[key], []).append(st.progress.job_id)
        for cluster, job_ids in due.items():
            try:
                await self.client.get_workflow_handle(watcher_id(cluster, self.task_queue)).signal(
                    "follow", FollowRequest(job_ids=job_ids, until_s=now + FOLLOW_LEASE_S))
            except RPCError:
                continue  # no watcher running: nothing to speed up
            self._leased.update((j, now) for j in job_ids)
