"""The cluster watcher's loop body (``ClusterWatch``) against the stand-in job list: what the poll loop
decides from one poll, before the dispatcher has read any details."""

from __future__ import annotations

import itertools

from activities.watch import ClusterWatch
from clients.iris import IrisClient
from domain.config import PolicySettings
from domain.models import JobProgress
from domain.watch import WatchRequest, WatchSet
from tests.iris.standin_jobs import StandinJobs


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _watch(job_id: str, state: str) -> WatchRequest:
    return WatchRequest(job_id=job_id, workflow_id=f"wf{job_id}", markers=[],
                        known=JobProgress(job_id=job_id, state=state, terminal=False),
                        registered_at="2026-12-01T00:00:00+00:00")


async def test_queued_jobs_are_polled_at_the_running_cadence_so_a_start_is_seen_at_once():
    """A job registered while queued starts running: it is seen by the next poll, at most the running
    interval later, never the idle one (issue 37: a job still queued at the first poll was next looked at
    15 s later, so a 4-target build took 30.7 s instead of ~17 s). Before that, the cadence was chosen from
    the details, which the dispatcher reads beside the loop after the cadence was chosen."""
    policy = PolicySettings()
    assert policy.watch_idle_interval_s > policy.watch_interval_s
    jobs = StandinJobs({"/u/a": "pending", "/u/b": "pending"})
    clock = FakeClock()
    async with IrisClient("http://standin", client_revision_date="2026-11-20", transport=jobs) as iris:
        engine = ClusterWatch(policy, clock=clock)
        engine.sync(WatchSet(watches=[_watch("/u/a", "pending"), _watch("/u/b", "pending")]))
        await engine.poll(iris)  # the listing poll: both still queued
        assert engine.interval() <= policy.watch_interval_s  # not the idle interval

        jobs.set_state("/u/a", "running")
        clock.t += policy.watch_interval_s
        await engine.poll(iris)  # GetJobState: /u/a changed; the dispatcher has not read it yet
        assert engine.dirty == {"/u/a"}
        assert engine.jobs["/u/a"].now.state == "pending"
        assert engine.interval() <= policy.watch_interval_s  # running: the normal cadence (5 s while the bucket is full)

        # The same when the once-a-minute listing poll is the one that sees the change.
        engine2 = ClusterWatch(policy, clock=clock)
        engine2.sync(WatchSet(watches=[_watch("/u/b", "pending"), _watch("/u/c", "pending"),
                                       _watch("/u/d", "pending"), _watch("/u/e", "pending")]))
        for j in ("/u/c", "/u/d", "/u/e"):
            jobs.set_state(j, "running")
        await engine2.poll(iris)  # ListJobs (pending) misses three: one GetJobState gives their state
        assert engine2.dirty == {"/u/c", "/u/d", "/u/e"}
        assert engine2.interval() <= policy.watch_interval_s


class _QueryHandle:
    """A watcher handle whose ``changes`` query fails ``failures`` times with ``status`` first."""

    def __init__(self, failures: int, status):
        self.id, self.failures, self.status, self.calls = "iris-watcher/q/c", failures, status, 0

    async def query(self, name, req, **kw):
        from temporalio.service import RPCError

        from domain.watch import WatchPage
        self.calls += 1
        if self.calls <= self.failures:
            raise RPCError("Timeout expired", self.status, b"")
        return WatchPage(next=0, watched=0)


async def test_the_first_watch_set_read_rides_out_query_timeouts_of_a_rolling_deploy():
    """The watcher's workflow task can sit on the sticky queue of a worker that just left: its query times
    out for a few seconds. The first read is retried in place (no failed attempt, no traceback), bounded."""
    import pytest
    from temporalio.service import RPCError, RPCStatusCode

    from activities import watch
    from activities.errors import Transient

    waits: list[float] = []

    async def sleep(s):
        waits.append(s)

    me = _QueryHandle(3, RPCStatusCode.CANCELLED)
    page = await watch._read_changes_at_start(me, ClusterWatch(PolicySettings()), sleep=sleep)
    assert page.watched == 0 and me.calls == 4 and waits == [1.0, 2.0, 4.0]
    with pytest.raises(Transient, match="not readable for 0 s"):  # bounded: then the policy retries, visibly
        await watch._read_changes_at_start(_QueryHandle(9, RPCStatusCode.DEADLINE_EXCEEDED),
                                           ClusterWatch(PolicySettings()), bound_s=0.0, sleep=sleep)
    with pytest.raises(RPCError):  # anything else is not a timeout: raised as it is
        await watch._read_changes_at_start(_QueryHandle(1, RPCStatusCode.INVALID_ARGUMENT),
                                           ClusterWatch(PolicySettings()), sleep=sleep)


def _most_in_a_minute(times: list[float]) -> int:
    times = sorted(times)
    return max((sum(1 for u in times if t - 60.0 < u <= t) for t in times), default=0)


async def test_the_budget_is_spent_on_evenly_spaced_polls_and_never_exceeded():
    """The budget is a hard cap per sliding minute (``StatusWindow``): the cadence spends it on evenly spaced
    polls (5 s at 12 a minute) whatever the job shows, its final markers included (the token bucket before
    let them, and the minute after an end, poll at 3 s: 20 a minute), listing polls included. Driven
    through ``poll`` and ``next_poll`` (the loop's own schedule) on a fake clock."""
    policy = PolicySettings()
    regular = 60.0 / policy.watch_status_budget_per_min
    markers = ["m1", "m2", "m3", "m4"]
    jobs = StandinJobs({"/u/a": "running"})
    clock = FakeClock()
    sent: list[float] = []
    async with IrisClient("http://standin", client_revision_date="2026-11-20", transport=jobs) as iris:
        engine = ClusterWatch(policy, clock=clock)
        w = _watch("/u/a", "running").model_copy(update={"markers": markers})
        engine.sync(WatchSet(watches=[w]))
        polls: list[float] = []

        async def run_until(end: float) -> None:
            due = clock.t
            while clock.t < end:
                before = sum(jobs.requests.values())
                await engine.poll(iris)
                sent.extend([clock.t] * (sum(jobs.requests.values()) - before))
                polls.append(clock.t)
                due = engine.next_poll(due)
                clock.t = max(clock.t, due)

        start = clock.t
        engine.jobs["/u/a"].now.last_marker = "m2"  # building
        await run_until(start + 10 * 60)
        engine.jobs["/u/a"].now.last_marker = "m3"  # pushing: one of the final two markers
        await run_until(start + 14 * 60)
        assert {b - a for a, b in itertools.pairwise(polls)} == {regular}
        assert jobs.requests["ListJobs"] == 14  # the once-a-minute listing replaces a poll
        assert _most_in_a_minute(sent) == policy.watch_status_budget_per_min
        # A budget larger than the cadences need polls at the fast interval.
        generous = ClusterWatch(policy.model_copy(update={"watch_status_budget_per_min": 600.0}), clock=clock)
        assert generous.interval() == policy.watch_fast_interval_s


def test_the_status_window_is_a_sliding_minute():
    from activities.watch import StatusWindow

    clock = FakeClock()
    win = StatusWindow(12, clock=clock)
    for i in range(11):
        clock.t = 1000.0 + 5 * i
        win.take()
    clock.t = 1052.0
    assert win.free_at() == 1052.0 and win.wait_s() == 0.0  # the 12th slot
    win.take()
    assert win.free_at() == 1060.0 and win.free_at(1070.0) == 1070.0  # then when the oldest leaves
    assert max(win.ages()) == 52.0 and len(win.ages()) == 12
    other = StatusWindow(12, clock=clock)
    other.restore(win.ages())  # another attempt starts from the heartbeat's ages
    assert other.free_at() == 1060.0


def test_watch_intervals_out_of_order_are_refused_naming_the_fields():
    import pytest
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="watch_fast_interval_s <= watch_interval_s <= watch_idle_interval_s"):
        PolicySettings(watch_fast_interval_s=8.0)


async def test_a_poll_answered_while_a_vanished_job_is_being_read_does_not_read_it_again():
    """A job absent from the poll's answer is being read (``GetJobStatus`` in flight, slow under load, to
    confirm it before it is reported missing) when the next poll comes back without it again: that poll
    must not mark the job for a second read. Before, the job's ``now`` still said running, so the poll
    marked it dirty again and the next dispatch round read it a second time (the 1,500-watch test saw two
    ``GetJobStatus`` for one end on CI, when ends were still read in detail)."""
    import asyncio

    jobs = StandinJobs({"/u/a": "running", "/u/b": "running"})
    async with IrisClient("http://standin", client_revision_date="2026-11-20", transport=jobs) as iris:
        engine = ClusterWatch(PolicySettings(), clock=FakeClock())
        engine.details_at = float("inf")  # GetJobState polls only
        engine.sync(WatchSet(watches=[_watch("/u/a", "running"), _watch("/u/b", "running")]))
        del jobs.jobs["/u/a"]  # pruned: absent from GetJobState, GetJobStatus answers not found
        await engine.poll(iris)
        assert engine.dirty == {"/u/a"}

        jobs.stall_once["GetJobStatus"] = 0.5

        async def poll_meanwhile() -> None:
            await asyncio.sleep(0.1)
            assert engine.jobs["/u/a"].now.state == "running"  # the read is still in flight
            await engine.poll(iris)  # absent again while the job is still being read

        read, _ = await asyncio.gather(engine.dispatch(iris), poll_meanwhile())
        assert read == ["/u/a"] and engine.jobs["/u/a"].now.missing
        assert engine.dirty == set() and await engine.dispatch(iris) == []
        assert jobs.requests["GetJobStatus"] == 1

        # A later change is still seen, and taken from the poll as it is (no detail read).
        engine.told("/u/a", engine.jobs["/u/a"].now)  # its target knows: no longer polled
        jobs.set_state("/u/b", "failed")
        await engine.poll(iris)
        assert engine.dirty == {"/u/b"}
        assert await engine.dispatch(iris) == ["/u/b"] and jobs.requests["GetJobStatus"] == 1
        assert engine.jobs["/u/b"].now.state == "failed"


async def test_a_listing_of_many_pages_is_read_a_page_at_a_time_in_place_of_a_poll():
    """At 1,200 running jobs a listing takes 3 pages of 500: it cannot replace a poll, so it is read one page
    per ``paged_listing_every`` (5 minutes) in place of a poll, round the offsets, each page bringing the
    details of the jobs on it; every page is a request of the window (5,000 jobs measured 18 status
    requests a minute idle against a budget of 12 when a whole listing came at once)."""
    policy = PolicySettings()
    ids = [f"/u/job-{i:04d}" for i in range(1200)]
    jobs = StandinJobs(dict.fromkeys(ids, "running"))
    clock = FakeClock()
    async with IrisClient("http://standin", client_revision_date="2026-11-20", transport=jobs) as iris:
        engine = ClusterWatch(policy, clock=clock)
        engine.sync(WatchSet(watches=[_watch(j, "running") for j in ids]))
        assert engine.paged_listing_every() == 300.0
        await engine.poll(iris)  # the first poll reads the first page (nothing read yet) ...
        assert dict(jobs.requests) == {"ListJobs": 1}  # ... and only that
        assert engine.jobs[ids[0]].now.elapsed_s > 0 and engine.jobs[ids[600]].now.elapsed_s == 0
        assert engine.dirty == set()

        pages, due = [], clock.t
        while clock.t < 1000.0 + 16 * 60:
            due = engine.next_poll(due)
            clock.t = due
            before = jobs.requests["ListJobs"]
            await engine.poll(iris)
            if jobs.requests["ListJobs"] > before:
                pages.append(clock.t - 1000.0)
        assert pages == [300.0, 600.0, 900.0]
        assert all(engine.jobs[j].now.elapsed_s > 0 for j in ids)  # every page read once by now
        assert jobs.requests["GetJobState"] == 16 * 12 - 3  # every other slot a poll


async def test_an_end_without_warning_is_taken_from_the_poll_with_no_further_request():
    """The ended job's state is taken from the poll as it is: no detail request before its target is woken,
    and the others keep the regular cadence (the fast minute after an end went over the budget)."""
    policy = PolicySettings()
    ids = [f"/u/g{i}" for i in range(4)]
    jobs = StandinJobs({j: "running" for j in ids})
    clock = FakeClock()
    async with IrisClient("http://standin", client_revision_date="2026-11-20", transport=jobs) as iris:
        engine = ClusterWatch(policy, clock=clock)
        engine.sync(WatchSet(watches=[_watch(j, "running") for j in ids]))
        engine.details_at = clock.t  # GetJobState polls only
        await engine.poll(iris)
        jobs.set_state(ids[0], "failed")
        clock.t += 5
        await engine.poll(iris)
        before = dict(jobs.requests)
        assert await engine.dispatch(iris) == [ids[0]]
        assert dict(jobs.requests) == before  # the state as the poll reported it: no further request
        assert engine.jobs[ids[0]].now.state == "failed" and engine.jobs[ids[0]].now.terminal
        assert [(w, p.state) for w, p in engine.wakeups()] == [(f"wf{ids[0]}", "failed")]
        assert engine.interval() == 60.0 / policy.watch_status_budget_per_min


async def test_5000_watched_jobs_stay_within_the_status_budget_listing_pages_included():
    """5,000 running jobs, nothing changing, for 20 minutes on a fake clock through the loop's own schedule
    (``poll``, ``next_poll``): every request counted, ``ListJobs`` pages included, at most
    ``watch_status_budget_per_min`` a minute (issue 37: 19 a minute, the listing's 10 pages on top of the
    polls): a hard cap in every sliding minute, and the polls keep almost the whole budget."""
    policy = PolicySettings()
    ids = [f"/runner/s{i:05d}" for i in range(5000)]
    jobs = StandinJobs({j: "running" for j in ids})
    clock = FakeClock()
    async with IrisClient("http://standin", client_revision_date="2026-11-20", transport=jobs) as iris:
        engine = ClusterWatch(policy, clock=clock)
        engine.sync(WatchSet(watches=[_watch(j, "running") for j in ids]))
        start, due = clock.t, clock.t
        while clock.t < start + 20 * 60:
            await engine.poll(iris)
            due = engine.next_poll(due)
            clock.t = max(clock.t, due)
        minutes = (clock.t - start) / 60
    status = sum(jobs.requests[m] for m in ("GetJobState", "ListJobs", "GetJobStatus"))
    assert jobs.requests["ListJobs"] == 4  # a page every 5 minutes
    assert status / minutes <= policy.watch_status_budget_per_min, (dict(jobs.requests), minutes)
    assert engine.window.ages() and len(engine.window.ages()) <= policy.watch_status_budget_per_min
    assert engine.regular_interval() == 5.0 and jobs.requests["GetJobState"] >= 20 * 12 - 4


class _SlowQueryHandle:
    """A watcher handle whose ``changes`` query answers after ``delay_s`` (a loaded worker: the real one timed
    out at 5 s several times a minute in bench/monitoring.py)."""

    def __init__(self, delay_s: float):
        self.id, self.delay_s, self.calls = "iris-watcher/q/c", delay_s, 0

    async def query(self, name, req, **kw):
        import asyncio

        from domain.watch import WatchPage
        self.calls += 1
        await asyncio.sleep(self.delay_s)
        return WatchPage(next=req.since, watched=1)


async def test_a_slow_watch_set_read_never_delays_a_poll(tmp_path):
    """The watch set's changes are read beside the wait before each poll, and the poll goes at its time even
    when that read has not answered yet (issue 37: the poll used to wait for it, and a query timing out under
    load made a 10 s gap between two polls). Fails on the old loop: one poll per slow read."""
    import datetime

    from temporalio.testing import ActivityEnvironment

    from activities import watch
    from domain.config import ServiceConfig
    from domain.watch import WatchClusterInput, WatchClusterResult

    policy = PolicySettings(watch_interval_s=0.5, watch_fast_interval_s=0.5, watch_idle_interval_s=0.5,
                            watch_status_budget_per_min=600)
    config = ServiceConfig.model_validate({
        "work_dir": str(tmp_path), "repos": {"marinskyrl_url": "file:///nowhere", "harbor_url": "file:///nowhere"},
        "clusters": {"c": {"controller_url": "https://standin.invalid",
                           "client_revision_date": datetime.date.today().isoformat()}},
        "registry": {"image_repository": "127.0.0.1:5000/gpu-rl", "user": {"kind": "literal_public", "value": "u"},
                     "token": {"kind": "env", "name": "X"}},
        "policy": policy.model_dump()})
    jobs = StandinJobs({"/u/a": "running"})
    me = _SlowQueryHandle(2.0)
    async with IrisClient("http://standin", client_revision_date="2026-11-20", transport=jobs) as iris:
        engine = ClusterWatch(policy)
        engine.sync(WatchSet(watches=[_watch("/u/a", "running")]))
        result = await ActivityEnvironment().run(
            watch.WatchActivities(config)._poll_loop, WatchClusterInput(cluster="c", return_after_s=4.0), engine,
            iris, watch._Watchdog(engine), me, WatchClusterResult())
    polls = [t for m, _, t in jobs.calls if m in ("GetJobState", "ListJobs")]
    gaps = [b - a for a, b in itertools.pairwise(polls)]
    assert result.polls >= 7 and me.calls >= 1, (result.polls, me.calls)
    assert max(gaps) < 0.5 + 0.4, gaps  # one interval, whatever the read takes


async def test_a_trusted_feed_slows_the_regular_polls_only_once_every_watched_job_has_started():
    """The controller's audit feed names ends, not starts: while a watched job is still queued the regular
    cadence stays (a start is seen at the next poll); once all have started, the regular polls become the
    feed's backstop. Before, a trusted feed slowed the polls at once, so a rebuild's job was seen running
    15 s after its start (test_rerun_e2e cancelled it only after more kaniko steps had run and been cached)."""
    policy = PolicySettings(watch_feed_backstop_s=20.0)
    jobs = StandinJobs({"/u/a": "pending"})
    clock = FakeClock()
    async with IrisClient("http://standin", client_revision_date="2026-11-20", transport=jobs) as iris:
        engine = ClusterWatch(policy, clock=clock)
        engine.sync(WatchSet(watches=[_watch("/u/a", "pending")]))
        engine.feed.state, engine.feed.ok_at = "ok", clock()  # a feed that has shown its lines and reads fine
        assert engine.feed_healthy()
        await engine.poll(iris)
        assert engine.interval() <= policy.watch_interval_s  # queued: the regular cadence

        jobs.set_state("/u/a", "running")
        clock.t += 1.0
        engine.feed.ok_at = clock()
        await engine.poll(iris)
        assert engine.jobs["/u/a"].state == "running"
        assert engine.interval() == 20.0  # all started: the feed watches for the ends (policy.watch_feed_backstop_s)


class _FailingLogs(StandinJobs):
    """The job list answers; the controller's log store does not (FetchLogs of the audit feed fails)."""

    def __init__(self, jobs: dict[str, str]) -> None:
        super().__init__(jobs, audit_lag_s=0.0)
        self.fail_feed = True

    async def handle_async_request(self, request):
        import httpx

        if self.fail_feed and request.url.path.endswith("FetchLogs") and b'"/system/controller"' in request.content:
            self.requests["FetchLogs(feed)"] += 1
            return httpx.Response(500, json={"code": "internal", "message": "log store down"})
        return await super().handle_async_request(request)


async def test_a_failing_feed_is_read_again_after_a_growing_wait_and_at_once_again_when_it_answers():
    """A feed read that fails is tried again after 1, 2, 4 ... read intervals (at most
    ``policy.watch_feed_retry_max_s``), visibly (``feed.failures``, ``feed.state``), and the regular cadence holds
    meanwhile; the first read that succeeds goes back to one per interval. Before, a failing log store was asked
    every second for as long as it failed."""
    import pytest

    from clients.iris import IrisError

    policy = PolicySettings(watch_feed_interval_s=1.0, watch_feed_retry_max_s=8.0)
    jobs = _FailingLogs({"/u/a": "running"})
    async with IrisClient("http://standin", client_revision_date="2026-11-20", transport=jobs) as iris:
        engine = ClusterWatch(policy, clock=FakeClock())
        engine.sync(WatchSet(watches=[_watch("/u/a", "running")]))
        waits = []
        for _ in range(6):
            with pytest.raises(IrisError, match="log store down"):
                await engine.read_feed(iris)
            waits.append(engine.feed_retry_in())
        assert waits == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
        assert engine.feed.view()["state"] == "failing" and engine.feed.view()["failures"] == 6
        assert not engine.feed_healthy() and engine.interval() == 60.0 / 12  # the regular cadence meanwhile
        jobs.fail_feed = False
        await engine.read_feed(iris)
        assert engine.feed_retry_in() == 1.0 and engine.feed.failures == 0
        assert engine.feed.state in ("ok", "unproven")


async def test_with_the_feed_turned_off_nothing_is_read_and_the_polls_keep_the_regular_cadence():
    """``policy.watch_feed = false``: no audit-feed request at all, the feed stays ``off``, polls every 5 s."""
    policy = PolicySettings(watch_feed=False)
    jobs = StandinJobs({"/u/a": "running"}, audit_lag_s=0.0)
    async with IrisClient("http://standin", client_revision_date="2026-11-20", transport=jobs) as iris:
        engine = ClusterWatch(policy, clock=FakeClock())
        engine.sync(WatchSet(watches=[_watch("/u/a", "running")]))
        await engine.poll(iris)
        assert await engine.read_feed(iris) == 0
    assert jobs.requests["FetchLogs(feed)"] == 0 and engine.feed.state == "off"
    assert engine.interval() == 60.0 / 12


class _Unreachable:
    """A Temporal client whose every call to a target fails as UNAVAILABLE (the frontend is down)."""

    def __init__(self) -> None:
        self.calls = 0

    def get_workflow_handle(self, workflow_id: str):
        from temporalio.service import RPCError, RPCStatusCode

        outer = self

        class _Handle:
            async def execute_update(self, *a, **kw):
                outer.calls += 1
                raise RPCError("frontend unavailable", RPCStatusCode.UNAVAILABLE, b"")

            async def signal(self, *a, **kw):
                outer.calls += 1
                raise RPCError("frontend unavailable", RPCStatusCode.UNAVAILABLE, b"")
        return _Handle()


async def test_a_wake_up_that_fails_is_tried_again_after_a_growing_wait_not_on_every_round():
    """Wake-ups are tasks of their own (``_Waker``); one that fails (not NOT_FOUND) is not marked as told and is
    tried again after 1, 2, 4 ... s (at most WAKE_RETRY_MAX_S), so a dispatcher woken by every completion never
    spins on a target it cannot reach."""
    import asyncio

    from temporalio.testing import ActivityEnvironment

    from activities import watch

    engine = ClusterWatch(PolicySettings())
    engine.sync(WatchSet(watches=[_watch("/u/a", "running")]))
    engine.jobs["/u/a"].now = JobProgress(job_id="/u/a", state="succeeded", terminal=True)
    client = _Unreachable()

    async def run() -> list[int]:
        beat = watch._Watchdog(engine)
        waker = watch._Waker(client, engine, beat)
        started = []
        for _ in range(5):  # five dispatcher rounds in quick succession
            started.append(waker.start())
            await asyncio.sleep(0.05)
        await waker.close()
        return started

    started = await ActivityEnvironment().run(run)
    assert started == [1, 0, 0, 0, 0] and client.calls == 2  # the update, then the signal; not again within 1 s
    assert not engine.jobs["/u/a"].told.terminal  # not told: the next try sends it
