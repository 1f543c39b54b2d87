"""The cluster watcher's loop body against the real local controller: one status request per poll serves
every running job, details are fetched only on change, logs only at the progress cadence.

Requests are counted on the wire by a recording httpx transport (what the controller receives), not by
the client's own bookkeeping."""

from __future__ import annotations

import asyncio
import datetime
import itertools
import uuid
from collections import Counter

import httpx

from activities.watch import ClusterWatch
from clients.iris import IrisClient
from domain.config import PolicySettings
from domain.models import JobProgress
from domain.watch import WatchRequest, WatchSet
from tests.iris.helpers import bash_spec, wait_for

N_JOBS = 8


FEED_READ = "FetchLogs(feed)"  # a read of the controller's audit lines (/system/controller), counted apart


class RecordingTransport(httpx.AsyncBaseTransport):
    """Forwards to the real controller and counts requests by RPC method (last path segment); a FetchLogs of
    the controller's own key (the watcher's audit feed) counts as ``FEED_READ``."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.requests: Counter[str] = Counter()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        method = request.url.path.rsplit("/", 1)[-1]
        if method == "FetchLogs" and b'"/system/controller"' in request.content:
            method = FEED_READ
        self.requests[method] += 1
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _request(job_id: str, known: JobProgress, markers: list[str]) -> WatchRequest:
    return WatchRequest(job_id=job_id, workflow_id=f"wf{job_id}", markers=markers, known=known,
                        registered_at="2026-12-01T00:00:00+00:00")


async def test_one_status_request_per_poll_serves_every_running_job(iris_controller):
    recorder = RecordingTransport()
    iris = IrisClient(iris_controller.url, client_revision_date=datetime.date.today().isoformat(),
                      cluster_name="local", transport=recorder)
    run = uuid.uuid4().hex[:6]
    ids = [f"/tester/watch-{run}-{i}" for i in range(N_JOBS)]
    gate = f"/tmp/watch-gate-{run}"  # the jobs run until this file exists
    try:
        for job_id in ids:
            await iris.launch_job(bash_spec(job_id, f"echo 'step one'; while [ ! -e {gate} ]; do sleep 0.2; done;"
                                                    " echo 'step two'"))
        for job_id in ids:
            await wait_for(iris, job_id, lambda i: i.state.value == "running")
        clock = FakeClock()
        engine = ClusterWatch(PolicySettings(watch_signal_progress_s=600.0), clock=clock)
        known = {j: JobProgress(job_id=j, state="running", terminal=False) for j in ids}
        engine.sync(WatchSet(watches=[_request(j, known[j], ["step one", "step two"]) for j in ids]))

        # Polls while nothing changes: one request each for all the jobs — ListJobs when the details
        # (pending reasons, preemptions) are due, GetJobState otherwise — never one per job.
        recorder.requests.clear()
        for _ in range(5):
            await engine.poll(iris)
        assert recorder.requests == Counter({"ListJobs": 1, "GetJobState": 4})
        assert engine.wakeups() == []
        clock.t += PolicySettings().watch_progress_interval_s
        recorder.requests.clear()
        await engine.poll(iris)
        assert recorder.requests == Counter({"ListJobs": 1})

        # The log progress: ONE FetchLogs for every running job (their common prefix, from the log
        # store's global cursor), routed to jobs by key; a new marker is progress only, so nobody is
        # woken (the last wake-up was just now).
        reads = 0
        for _ in range(60):  # the log store may lag the job state a little
            recorder.requests.clear()
            assert engine.logs_due()
            await engine.read_logs(iris)
            reads += 1
            assert recorder.requests == Counter({"FetchLogs": 1})
            if all(engine.jobs[j].now.last_marker == "step one" for j in ids):
                break
            await asyncio.sleep(0.25)
            clock.t += PolicySettings().watch_log_interval_s
        assert all(engine.jobs[j].now.last_marker == "step one" for j in ids)
        assert engine.log_cursor > 0
        assert engine.wakeups() == []
        assert not engine.logs_due()  # not due again before the log interval

        # The jobs finish: the next polls see the change with one GetJobState, and every target is woken
        # with its terminal state.
        open(gate, "w").close()
        engine.details_at = clock.t  # no ListJobs poll due while the jobs end: GetJobState only
        woken: dict[str, JobProgress] = {}
        recorder.requests.clear()
        for polls in itertools.count(1):
            await engine.poll(iris)
            await engine.dispatch(iris)
            for workflow_id, p in engine.wakeups():
                woken[workflow_id] = p
                engine.told(p.job_id, p)
            if len(woken) == N_JOBS or polls > 200:
                break
            await asyncio.sleep(0.25)
        assert {p.job_id for p in woken.values()} == set(ids)
        assert all(p.state == "succeeded" and p.terminal for p in woken.values())
        assert recorder.requests["GetJobState"] == polls  # one per poll
        # No detail read: the state the poll reported is what the target is woken with (it reads what it
        # acts on itself), so an end costs no request beyond the poll that saw it.
        assert recorder.requests["GetJobStatus"] + recorder.requests["ListJobs"] == 0
        assert sorted(engine.finished()) == sorted(ids)
        recorder.requests.clear()
        await engine.poll(iris)  # told terminal: nothing left to ask the controller
        assert recorder.requests == Counter()
    finally:
        open(gate, "w").close()
        await iris.aclose()


async def test_a_vanished_job_is_confirmed_before_it_is_reported_missing(iris_controller):
    recorder = RecordingTransport()
    iris = IrisClient(iris_controller.url, client_revision_date=datetime.date.today().isoformat(),
                      cluster_name="local", transport=recorder)
    ghost = f"/tester/never-launched-{uuid.uuid4().hex[:6]}"
    try:
        engine = ClusterWatch(PolicySettings())
        engine.sync(WatchSet(watches=[_request(ghost, JobProgress(job_id=ghost, state="running", terminal=False),
                                               [])]))
        await engine.poll(iris)
        await engine.dispatch(iris)
        assert recorder.requests == Counter({"ListJobs": 1, "GetJobStatus": 1})  # absent → confirmed
        ((_, p),) = engine.wakeups()
        assert p.missing and p.terminal and p.state == "missing" and "not a success" in (p.error or "")
        # The same through the light poll: absent from GetJobState, confirmed by GetJobStatus.
        ghost2 = f"{ghost}-2"
        engine.sync(WatchSet(watches=[_request(ghost2, JobProgress(job_id=ghost2, state="running", terminal=False),
                                               [])]))
        recorder.requests.clear()
        await engine.poll(iris)
        await engine.dispatch(iris)
        assert recorder.requests == Counter({"GetJobState": 1, "GetJobStatus": 1})
        ((_, p2),) = engine.wakeups()
        assert p2.job_id == ghost2 and p2.missing and p2.terminal
    finally:
        await iris.aclose()


async def test_an_unreachable_controller_is_never_terminal():
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    iris = IrisClient(f"http://127.0.0.1:{port}", client_revision_date="2026-11-20", cluster_name="c",
                      max_attempts=1)
    clock = FakeClock()
    try:
        engine = ClusterWatch(PolicySettings(watch_signal_progress_s=600.0), clock=clock)
        job = "/u/build"
        engine.sync(WatchSet(watches=[_request(job, JobProgress(job_id=job, state="running", terminal=False), [])]))
        await engine.poll(iris)
        t = engine.jobs[job]
        assert t.now.state == "running" and not t.now.terminal and not t.now.controller_reachable
        assert engine.wakeups() == []  # progress only, and the target was told just now
        clock.t += 601
        ((_, p),) = engine.wakeups()  # later it is shown, still running, never terminal
        assert not p.terminal and p.state == "running" and "unreachable" in (p.error or "")
    finally:
        await iris.aclose()


async def test_jobs_a_listing_poll_finds_changed_reach_the_dispatcher_with_their_new_states():
    """The listing poll hands changed jobs to the dispatcher only together with their new states (one page of
    every state: no further request), so a dispatcher round that runs while the listing is still out has
    nothing to read, and none of them is read alone."""
    from tests.iris.standin_jobs import StandinJobs

    jobs = [f"/u/burst-{i}" for i in range(6)]
    standin = StandinJobs({j: "running" for j in jobs})
    iris = IrisClient("http://standin.invalid", client_revision_date=datetime.date.today().isoformat(),
                      transport=standin)
    try:
        engine = ClusterWatch(PolicySettings(watch_status_budget_per_min=600))
        engine.sync(WatchSet(watches=[_request(j, JobProgress(job_id=j, state="running", terminal=False), [])
                                      for j in jobs]))
        for j in jobs:
            standin.set_state(j, "succeeded")
        standin.stall_once = {"ListJobs": 0.5}  # the listing is slow to answer
        poll = asyncio.create_task(engine.poll(iris))  # details due: the listing poll
        await asyncio.sleep(0.2)
        assert standin.requests["ListJobs"] == 1 and not poll.done()
        assert await engine.dispatch(iris) == []  # a dispatcher round now has nothing to read yet
        await poll
        assert sorted(await engine.dispatch(iris)) == jobs
        assert standin.requests["GetJobStatus"] == standin.requests["GetJobState"] == 0  # the listing gave them all
        assert all(engine.jobs[j].now.state == "succeeded" for j in jobs)
    finally:
        await iris.aclose()
