"""The controller's audit feed against the real local controller (marin-iris 0.2.227): an end without warning
brings the next status read forward, a line a job prints cannot, and a feed that cannot be read leaves the
regular polls as they were.

The watcher's loop body (``ClusterWatch``) is driven step by step here, with the real clock: the test plays
the poll loop's part (read the feed, poll when ``feed_due`` or the regular ``next_poll`` says so). Requests
are counted on the wire (``RecordingTransport``). Causality, not timing: the regular cadence (3 status
requests a minute: one poll per 20 s) would not poll again before the end is seen, and the engine records
that the poll which found it was asked for by the feed."""

from __future__ import annotations

import asyncio
import datetime
import time
import uuid
from pathlib import Path

from activities.watch import ClusterWatch
from clients.iris import IrisClient
from domain.config import PolicySettings
from domain.controller_feed import AUDIT_LOGGER, CONTROLLER_LOG_KEY, parse_audit_line
from domain.models import JobProgress
from domain.watch import WatchSet
from tests.iris.helpers import bash_spec, proxy_without_log_server, wait_for, wait_terminal
from tests.iris.test_cluster_watch import FEED_READ, RecordingTransport, _request

SLOW = PolicySettings(watch_status_budget_per_min=3, watch_signal_progress_s=600.0)  # regular poll: every 20 s
STATUS = ("GetJobState", "ListJobs", "GetJobStatus")


def _client(url: str, recorder: RecordingTransport) -> IrisClient:
    return IrisClient(url, client_revision_date=datetime.date.today().isoformat(), cluster_name="local",
                      transport=recorder)


def _engine(job_id: str) -> ClusterWatch:
    engine = ClusterWatch(SLOW)
    engine.sync(WatchSet(watches=[_request(job_id, JobProgress(job_id=job_id, state="running", terminal=False),
                                           ["never printed"])]))
    return engine


async def _gated_job(iris: IrisClient, job_id: str, gate: Path, exit_code: int) -> None:
    await iris.launch_job(bash_spec(job_id, f"echo started; while [ ! -e {gate} ]; do sleep 0.2; done; "
                                            f"echo 'failing now'; exit {exit_code}"))
    await wait_for(iris, job_id, lambda i: i.state.value == "running")


def _terminal_wakeup(engine: ClusterWatch, job_id: str) -> JobProgress | None:
    for _, p in engine.wakeups():
        if p.job_id == job_id and p.terminal:
            return p
    return None


async def test_an_end_without_warning_is_read_when_the_feed_names_it_not_at_the_next_regular_poll(
        iris_controller, tmp_path):
    recorder = RecordingTransport()
    iris = _client(iris_controller.url, recorder)
    job_id = f"/tester/feed-end-{uuid.uuid4().hex[:8]}"
    gate = tmp_path / "gate"
    try:
        await _gated_job(iris, job_id, gate, exit_code=3)
        recorder.requests.clear()  # from here on, the watcher's requests only
        engine = _engine(job_id)
        await engine.read_feed(iris)
        assert engine.feed_healthy(), engine.feed.view()
        await engine.poll(iris)  # the regular poll (a ListJobs page): the job runs
        first_poll = time.monotonic()
        regular = engine.next_poll(first_poll)
        assert regular - first_poll >= 19.0  # the regular cadence would look again only 20 s later
        assert _terminal_wakeup(engine, job_id) is None

        gate.touch()  # the job fails mid-run, no marker announced it
        seen_at = None
        while time.monotonic() < regular:
            await engine.read_feed(iris)
            due = engine.feed_due()  # (now or later: read before the clock it is compared with)
            if time.monotonic() >= due:
                await engine.poll(iris, early=True)
                await engine.dispatch(iris)
                if _terminal_wakeup(engine, job_id) is not None:
                    seen_at = time.monotonic()
                    break
            await asyncio.sleep(0.5)
        assert seen_at is not None, (f"the end was not seen through the feed: {engine.feed.view()}, pending "
                                     f"{engine.feed.pending}, due in {engine.feed_due() - time.monotonic():.1f} s, "
                                     f"{engine.window.free()} free, jobs {[(t.seen, t.now.state) for t in engine.jobs.values()]}")
    finally:
        await iris.aclose()
        await recorder.aclose()

    progress = _terminal_wakeup(engine, job_id)
    assert progress.state == "failed"  # the status read's verdict, not the line's
    assert seen_at < regular  # seen before the regular cadence would have polled at all
    feed = engine.details()["feed"]
    assert feed["state"] == "ok" and feed["seen_early"] == 1 and feed["woke"] == [job_id], feed
    assert feed["misses"] == 0 and feed["disagreements"] == 0, feed
    # Two status requests (the regular poll and the one the feed asked for) within the cap of 3 a minute; the
    # feed's reads are log requests, counted apart, one per read.
    assert sum(recorder.requests[m] for m in STATUS) == 2, recorder.requests
    assert recorder.requests[FEED_READ] == feed["requests"] >= 2


async def test_a_line_a_job_prints_never_wakes_or_ends_a_watched_job(iris_controller, tmp_path):
    recorder = RecordingTransport()
    iris = _client(iris_controller.url, recorder)
    run = uuid.uuid4().hex[:8]
    watched, forger = f"/tester/feed-watched-{run}", f"/tester/feed-forger-{run}"
    forged = (f"2026-12-06 14:54:20,247 {AUDIT_LOGGER} event=job_terminated entity={watched} "
              f"trigger=task_updates_applied reason=Job completed successfully")
    gate = tmp_path / "gate"
    try:
        await _gated_job(iris, watched, gate, exit_code=0)
        engine = _engine(watched)
        await engine.read_feed(iris)
        await engine.poll(iris)
        # The forged line in the job's stdout, its stderr, and (in local mode) its argv, which the controller's
        # runtime logs under /system/controller inside its own line.
        await iris.launch_job(bash_spec(forger, f"echo '{forged}'; echo '{forged}' >&2; sleep 1"))
        await wait_terminal(iris, forger)
        # Proof the forgery reached the controller's own key (inside another logger's line), so the strict parse
        # is what refuses it.
        deadline = time.monotonic() + 20.0
        while True:
            page = await iris.fetch_logs(CONTROLLER_LOG_KEY, "exact", substring=f"event=job_terminated entity={watched}")
            if page.entries:
                break
            assert time.monotonic() < deadline, "the forged text never reached /system/controller"
            await asyncio.sleep(0.5)
        assert all(parse_audit_line(e.data, source=e.source) is None for e in page.entries), page.lines
        job_log = await iris.fetch_logs(f"{forger}/", "prefix")
        assert job_log.lines.count(forged) == 2, job_log.lines
        for _ in range(4):  # past the controller's log flush
            await engine.read_feed(iris)
            await asyncio.sleep(0.5)
        assert engine.feed.pending == {} and watched not in engine.feed.flagged, engine.feed.view()
        assert engine.feed_due() == float("inf")
        state = (await iris.job_states([watched]))[watched]
        assert state.value == "running"
        assert _terminal_wakeup(engine, watched) is None
    finally:
        gate.touch()
        await iris.aclose()
        await recorder.aclose()


async def test_a_feed_that_cannot_be_read_leaves_the_regular_polls(iris_controller, tmp_path):
    """Through a real controller listener whose log server is not registered: every feed read fails, the
    watcher keeps the regular cadence (one poll per 60 / budget s), and the end is found by a regular poll."""
    recorder = RecordingTransport()
    job_id = f"/tester/feed-down-{uuid.uuid4().hex[:8]}"
    gate = tmp_path / "gate"
    direct = IrisClient(iris_controller.url, client_revision_date=datetime.date.today().isoformat())
    policy = PolicySettings(watch_status_budget_per_min=12, watch_signal_progress_s=600.0)
    try:
        await _gated_job(direct, job_id, gate, exit_code=3)
        with proxy_without_log_server(iris_controller.url) as url:
            iris = _client(url, recorder)
            try:
                engine = ClusterWatch(policy)
                engine.sync(WatchSet(watches=[_request(job_id, JobProgress(job_id=job_id, state="running",
                                                                           terminal=False), ["x"])]))
                read_failed = False
                try:
                    await engine.read_feed(iris)
                except Exception:  # noqa: BLE001 - what it raised is recorded in the feed's state
                    read_failed = True
                assert read_failed and engine.feed.state == "failing", engine.feed.view()
                assert "log server" in engine.feed.error or "system.log-server" in engine.feed.error, engine.feed.error
                assert not engine.feed_healthy()
                assert engine.interval() == 5.0  # the regular cadence, as without a feed
                engine.feed.pending[job_id] = "job_terminated"  # even a line (had one come) cannot bring a poll
                assert engine.feed_due() == float("inf")
                engine.feed.pending.clear()
                await engine.poll(iris)
                gate.touch()
                await wait_terminal(direct, job_id)
                due = engine.next_poll(time.monotonic())
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                await engine.poll(iris)
                await engine.dispatch(iris)
            finally:
                await iris.aclose()
    finally:
        gate.touch()
        await direct.aclose()
        await recorder.aclose()
    progress = _terminal_wakeup(engine, job_id)
    assert progress is not None and progress.state == "failed"
    assert engine.feed.seen_early == 0 and engine.feed.early_polls == 0
