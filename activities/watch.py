"""The per-cluster Iris watcher: one status request per interval for every running job, targets woken on change.

Why a long-lived heartbeating activity (run by ``workflows/watcher.py``) rather than a workflow that
polls with a timer: the poll loop keeps its working state (what each target was last told, the
cluster's log cursor, the Iris client and, for tunnelled clusters, one kubectl port-forward) in memory
for its whole life, and a poll that finds nothing new costs no history event at all. The workflow holds
the durable part (who watches which job, and what each target was told, reported back in ``told``
batches); a restarted activity rebuilds from it in pages. Every payload is bounded whatever the number
of jobs (``domain/watch.py``): the heartbeat carries counters, the log cursor and the live progress of
followed jobs only.

Per tick, evenly spaced within a hard cap of ``policy.watch_status_budget_per_min`` status requests per
cluster in any sliding minute (``StatusWindow``, which every status request draws from, ``ListJobs`` pages
included): one status request for every watched job — ``GetJobState`` with all ids, or every
``watch_progress_interval_s``, when one page lists them all, ``ListJobs``, which also brings pending reasons
and preemption counts (a longer listing is read one page per 5 minutes in place of a poll). Jobs whose state
changed are handed to a dispatcher beside the poll loop, which takes the state the poll reported as it is
(no detail read: the target reads what it acts on) and wakes their targets concurrently, so a burst of ends
never delays the next poll; only a job absent from the answer is read alone (``GetJobStatus``), to confirm
it before it is reported missing. Queued jobs are polled like running ones. Logs: one ``FetchLogs`` per cluster every
``watch_log_interval_s`` (``watch_follow_interval_s`` while someone follows) for the common prefix of
every running job, from the log store's global cursor (``seq``), routed to jobs by key.

The controller's audit lines (``/system/controller``, domain/controller_feed.py) are read once a second beside the
polls (``_read_feed``: log requests, counted apart as ``feed.requests``): a line that a watched job ended (or a task
of it, or a worker failed) brings the next poll forward, inside the same window (``feed_due``); while that feed is
proven and healthy the regular polls are a backstop every ``watch_feed_backstop_s``, which leaves most slots to
such polls.
The verdict is always the poll's. A feed that fails, has shown no audit line yet, or missed an end a poll found,
leaves the regular cadence as it was (``feed.state`` in the heartbeat says which).

Guarantees kept from per-target polling: an unreachable controller is never terminal (the job keeps
its last known state, marked unreachable); a job absent from ``GetJobState`` is confirmed with
``GetJobStatus`` before it is reported missing, and missing is never success (the target lets the
registry decide). A loop that makes no progress for ``STALL_S`` stops the activity (and its heartbeat),
so Temporal retries it at once, on any worker, within one heartbeat timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Optional

import httpx
from temporalio import activity
from temporalio.client import Client, WorkflowUpdateFailedError, WorkflowUpdateRPCTimeoutOrCancelledError
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from activities.build import _progress
from activities.common import HEARTBEAT_EVERY_S, ActivityGroup, Heartbeater, iris_client
from activities.errors import Transient
from clients.iris import LIST_JOBS_MAX_OFFSET, LIST_JOBS_PAGE, IrisClient, JobState, NotFound, Unavailable
from domain.config import PolicySettings, ServiceConfig
from domain.controller_feed import (
    AUDIT_SUBSTRING,
    CONTROLLER_LOG_KEY,
    JOB_END_ACTIONS,
    WORKER_ACTIONS,
    AuditEvent,
    parse_audit_line,
)
from domain.models import JobProgress
from domain.redact import redact_obj, redact_value
from domain.watch import (
    ADOPT_PAGE_BUDGET_BYTES,
    TOLD_BATCH,
    AdoptChunk,
    FollowRequest,
    MarkerSet,
    PageRequest,
    WatchClusterInput,
    WatchClusterResult,
    WatcherInput,
    WatchJobInput,
    WatchPage,
    WatchRequest,
    WatchSet,
    is_state_change,
    marker_set_key,
    should_wake,
    user_prefix,
    watcher_id,
    watcher_task_queue,
)

JOB_CHANGED_SIGNAL = "job_changed"  # TargetBuildWorkflow.job_changed
DETAIL_CONCURRENCY = 8  # GetJobStatus of changed jobs not found by a batched ListJobs
SIGNAL_CONCURRENCY = 32  # wake-ups sent at once
WAKE_RETRY_MAX_S = 10.0  # the longest wait before a failed wake-up of a target is tried again (1, 2, 4, 8, 10 s)
LOG_PAGE = 5000  # lines per prefix FetchLogs
# Work over every watched job yields to the event loop this often: the worker's event loop also runs the
# workflow activations' deadlock timers (2 s), which a loop blocked by one long stretch would trip.
YIELD_EVERY = 500
LOG_PAGES_PER_READ = 4  # a read that finds full pages continues, at most this many requests per interval
LOG_LOOKBACK_MS = 120_000  # a fresh cursor reads only lines newer than the watcher's start minus this
# A listing that takes more than one request reads one page per this many seconds, beside the polls: pending
# reasons and preemption counts of thousands of jobs come later, and the polls keep almost all of the budget.
PAGED_LISTING_EVERY_S = 300.0
FOLLOW_VIEW_MAX = 200  # live progress in the heartbeat: followed jobs only, at most this many
STATUS_METHODS = ("GetJobState", "ListJobs", "GetJobStatus")
# The controller's audit lines as a change feed (domain/controller_feed.py): one FetchLogs of /system/controller
# per ``watch_feed_interval_s`` while jobs are watched (log requests, never status requests: at most 60 a minute per
# cluster at 1 s, plus a page more only when a page came back full). While the feed is healthy the regular polls
# are only the backstop for what it cannot see (a transition without an audit line): one per
# ``watch_feed_backstop_s``, so most of the window's slots are free for reads the feed asks for. A poll that finds
# an end the feed has not reported within ``watch_feed_confirm_s`` is a feed that misses ends (lagging, or a
# transition without a line): the regular cadence is used for ``watch_feed_penalty_s``, visibly (``feed.state``).
FEED_PAGE = 2000  # audit lines per feed request
FEED_PAGES_PER_READ = 3
FEED_DEADLINE_S = 5.0  # one feed read's bound (the client's own retries included)
FEED_LOOKBACK_MS = 60_000  # a fresh cursor starts this far back (controller/worker clock skew; a line only wakes a read)
# A feed with no successful read for this long (plus one read interval) is not trusted: the regular cadence is back.
FEED_STALE_S = 5.0
FEED_MIN_GAP_S = 1.0  # the shortest gap between two status requests a feed line may bring
FEED_RECENT = 20  # job ids kept in the heartbeat's record of what the feed woke
# Watcher id -> (the run this worker last registered with, the marker set keys that run was given): a
# registration carries the marker texts only the first time a key goes to a run (see WatchRequest).
_MARKERS_SENT: dict[str, tuple[str, set[str]]] = {}
# A poll iteration, or a dispatch round in which no request completed, running longer than one heartbeat
# timeout (workflows/options.py) is a stalled watcher: every request inside is bounded (POLL_DEADLINE_S,
# RPC_DEADLINE_S), so only a starved or hung loop gets there.
STALL_S = 10.0
POLL_DEADLINE_S = 5.0  # one status request's bound inside an iteration (past it: unreachable this tick)
RPC_DEADLINE_S = 5.0  # one Temporal call (signal, query) of the watcher


@dataclass
class Tracked:
    """One watched job as the watcher sees it."""

    request: WatchRequest
    now: JobProgress  # the latest observation
    told: JobProgress  # what the target was last told (or told us it knows)
    told_at: float = 0.0  # monotonic time of the last wake-up sent
    detail_needed: bool = False  # fetch details on the next poll even if the state looks unchanged
    seen: str = ""  # the state the latest poll reported (before the dispatcher has read the details)
    read_stamp: int = 0  # ClusterWatch.stamp when the latest detail read of this job began
    reading: bool = False  # a detail read is in flight

    @property
    def state(self) -> str:
        """The job's latest known state, for the cadence: what the last poll saw, else the details."""
        return self.seen or self.now.state


@dataclass
class StatusWindow:
    """The status budget as a hard cap: at most ``limit`` status requests of a cluster in any sliding window of
    ``window_s`` (``policy.watch_status_budget_per_min`` a minute). Every status request of the watcher
    (``GetJobState`` polls, each ``ListJobs`` page, ``GetJobStatus`` detail reads) takes a slot first
    (``acquire``: it waits for one), so no cadence, burst or listing can exceed it (issue 37: a token bucket
    that banked 36 requests let the fast cadence after an end send 20 a minute).

    A sliding window of send times rather than a token bucket: a bucket of rate r and capacity c allows
    c + r in a window, so with any banked tokens a bucket of 12 a minute exceeds 12 in some minute."""

    limit: int
    window_s: float = 60.0
    clock: Callable[[], float] = time.monotonic
    # One cell per request in the window: [when it was taken, then when its reply came]. A request counts from
    # its reply: a request whose wire time came later than its slot (a busy event loop) cannot then bring two
    # requests on the wire closer than the window allows, whatever the lag.
    sent: list = field(default_factory=list)

    def _trim(self, now: float) -> None:
        self.sent = [c for c in self.sent if c[0] > now - self.window_s]

    def free_at(self, at: float | None = None) -> float:
        """The earliest moment at or after ``at`` (default now) when one request may be sent."""
        now = self.clock()
        at = now if at is None else max(at, now)
        self._trim(now)
        inside = sorted(c[0] for c in self.sent if c[0] > at - self.window_s)
        if len(inside) < self.limit:
            return at
        return inside[len(inside) - self.limit] + self.window_s

    def wait_s(self) -> float:
        """Seconds until one request may be sent."""
        return max(0.0, self.free_at() - self.clock())

    def take(self) -> list:
        now = self.clock()
        self._trim(now)
        cell = [now]
        self.sent.append(cell)
        return cell

    def done(self, cell: list) -> None:
        """The request of ``cell`` has its reply (or failed): it counts from now."""
        cell[0] = max(cell[0], self.clock())

    async def acquire(self, sleep: Callable[[float], object] = asyncio.sleep) -> list:
        """Wait for a slot (bounded: at most one window) and take it; ``done`` it when the reply is in."""
        while (wait := self.wait_s()) > 0:
            await sleep(wait)
        return self.take()

    def free(self) -> int:
        """Requests that may be sent now without waiting."""
        now = self.clock()
        self._trim(now)
        return max(0, self.limit - len(self.sent))

    def ages(self) -> list[float]:
        """Seconds since each request in the window (heartbeat: another attempt starts from them)."""
        now = self.clock()
        self._trim(now)
        return sorted(round(now - c[0], 3) for c in self.sent)

    def restore(self, ages: list[float]) -> None:
        """Count the requests of a previous attempt (its heartbeat's ``ages``) unless this window has them."""
        now = self.clock()
        if self.sent:  # the same process's window: it already holds them
            return
        self.sent = [[now - float(a)] for a in ages or [] if now - float(a) > now - self.window_s]


def status_limit(policy: PolicySettings) -> int:
    """Requests allowed in one sliding minute: ``watch_status_budget_per_min`` (at least one)."""
    return max(1, math.floor(policy.watch_status_budget_per_min))


# Cluster -> the status window of this worker process: an attempt that replaces another one here (a retry, a
# continue-as-new) keeps counting the requests its predecessor sent in the last minute.
_WINDOWS: dict[str, StatusWindow] = {}


def _terminal(state: str) -> bool:
    return JobState.parse(state).is_terminal


def common_prefix(job_ids: list[str]) -> str:
    """The longest common prefix of ``job_ids`` (one job: ``<job>/``): the FetchLogs/ListJobs prefix
    that covers all of them and as few other jobs as possible."""
    if not job_ids:
        return "/"
    if len(job_ids) == 1:
        return f"{job_ids[0]}/"
    return os.path.commonprefix(job_ids) or "/"


@dataclass
class FeedState:
    """What the controller's audit feed told the watcher, and whether it is trusted (heartbeat: ``feed``).

    ``state``: ``off`` (not read yet), ``unproven`` (reads succeed but no audit line has come yet: a controller
    logging below INFO writes none, and a silent feed must not look like a quiet one), ``ok``, ``failing`` (the
    last read failed: ``error``), ``missed`` (a poll found an end the feed never reported: the regular cadence
    until ``degraded_until``). Anything but a fresh ``ok`` means the watcher polls at the regular cadence, as
    without a feed."""

    state: str = "off"
    audit_lines: int = 0  # every audit line read (any action, any job): the proof the feed is live
    error: str = ""
    ok_at: float = float("-inf")  # clock of the last successful read
    degraded_until: float = float("-inf")
    requests: int = 0  # FetchLogs of the feed (log requests, counted apart from status requests)
    lines: int = 0  # audit lines about watched jobs (or failed workers)
    pending: dict[str, str] = field(default_factory=dict)  # job -> action: read its state at the next poll
    flagged: dict[str, float] = field(default_factory=dict)  # job -> clock when the feed last named it
    unconfirmed: dict[str, float] = field(default_factory=dict)  # ends a poll found, not (yet) in the feed
    early_polls: int = 0  # polls run before the regular cadence because of a feed line
    seen_early: int = 0  # ends such a poll found
    woke: list[str] = field(default_factory=list)  # the latest jobs whose end a feed-woken poll found
    misses: int = 0
    failures: int = 0  # failed reads in a row (the next read backs off)
    disagreements: int = 0  # an end line, then a status read (after it) that says the job is not terminal

    def view(self) -> dict:
        return {"state": self.state, "error": self.error, "requests": self.requests, "lines": self.lines,
                "audit_lines": self.audit_lines,
                "early_polls": self.early_polls, "seen_early": self.seen_early, "woke": list(self.woke),
                "misses": self.misses, "failures": self.failures, "disagreements": self.disagreements}


@dataclass
class ClusterWatch:
    """The watcher's loop body, Temporal-free: ``apply`` pages of the watch set, ``poll``, ``dispatch`` the
    changes, ``read_logs``; ``wakeups`` says which targets to signal. Tests drive it directly."""

    policy: PolicySettings
    jobs: dict[str, Tracked] = field(default_factory=dict)
    markers: dict[str, list[str]] = field(default_factory=dict)  # marker set key -> texts (once per contract)
    following: dict[str, float] = field(default_factory=dict)
    clock: Callable[[], float] = time.monotonic
    details_at: float = float("-inf")  # when the last ListJobs poll (with pending reasons, preemptions) ran
    rev: int = 0  # the watch set revision applied so far
    log_cursor: int = 0  # the log store's global cursor (seq) after the last prefix read
    log_since_ms: int = 0  # a fresh cursor reads lines newer than this only
    log_at: float = float("-inf")  # monotonic time of the last prefix read
    dirty: set[str] = field(default_factory=set)  # jobs whose details the dispatcher must read
    unreported: dict[str, JobProgress] = field(default_factory=dict)  # told targets, not yet told the workflow
    hints: dict[str, str] = field(default_factory=dict)  # dirty job -> the state GetJobState reported
    on_progress: Callable[[], None] = lambda: None  # called whenever a request of a dispatch completes
    window: StatusWindow | None = None  # the hard cap every status request draws from
    sleep: Callable[[float], object] = asyncio.sleep  # waiting for a slot of the window (tests: a fake clock's)
    page_at: float = float("-inf")  # when the last page of a paged (details-only) listing was read
    listing_at: tuple[int, int] = (0, 0)  # the paged listing's next (pair, offset)
    overflow_prefix: str | None = None  # a common prefix whose listing took more than one page
    stamp: int = 0  # orders status requests and detail reads by when they were sent (see ``_stale``)
    feed: FeedState = field(default_factory=FeedState)
    feed_cursor: int = 0  # the log store's cursor (seq) after the last audit line read
    feed_since_ms: int = 0  # a fresh feed cursor reads lines newer than this only
    feed_event: asyncio.Event = field(default_factory=asyncio.Event)  # a feed line asks for a poll
    polled_at: float = float("-inf")  # clock of the latest poll's start

    def __post_init__(self) -> None:
        if self.window is None:
            self.window = StatusWindow(status_limit(self.policy), clock=self.clock)
        if not self.log_since_ms:
            self.log_since_ms = int(time.time() * 1000) - LOG_LOOKBACK_MS
        if not self.feed_since_ms:
            self.feed_since_ms = int(time.time() * 1000) - FEED_LOOKBACK_MS

    def _next_stamp(self) -> int:
        self.stamp += 1
        return self.stamp

    @staticmethod
    def _stale(t: Tracked, sent: int) -> bool:
        """A poll answer that cannot show anything the job's details do not already (or are about to):
        a detail read is in flight, or began after the poll was sent. Without this, a poll answered while
        the dispatcher reads an end (or sent before it) still differs from ``now`` and reads the end again."""
        return t.reading or t.read_stamp > sent

    # ---------------------------------------------------------------- watch set
    def _adopt(self, req: WatchRequest) -> None:
        t = self.jobs.get(req.job_id)
        if t is None:
            # watch_job has just read the job's status: no second read unless it did not get one.
            self.jobs[req.job_id] = Tracked(request=req, now=req.known.model_copy(), told=req.known.model_copy(),
                                            told_at=self.clock(), detail_needed=req.known.state == "unknown")
        elif t.request.registered_at != req.registered_at:
            # A re-registration resets what the target is known to know: anything it missed is re-sent.
            t.request, t.told, t.told_at = req, req.known.model_copy(), self.clock()
        else:
            t.request = req

    def apply(self, page: WatchPage) -> None:
        """One page of the workflow's ``changes`` (in revision order)."""
        self.markers.update(page.marker_sets)
        for job_id in page.removed:
            self.jobs.pop(job_id, None)
            self.following.pop(job_id, None)
            self.dirty.discard(job_id)
        for req in page.watches:
            self._adopt(req)
            if req.job_id in page.following:
                self.following[req.job_id] = page.following[req.job_id]
        self.rev = max(self.rev, page.next)

    def sync(self, ws: WatchSet) -> None:
        """Adopt a whole watch set (markers inline): add new jobs, drop the others."""
        wanted = {w.job_id: w for w in ws.watches}
        for job_id in [j for j in self.jobs if j not in wanted]:
            del self.jobs[job_id]
        for req in wanted.values():
            key = req.marker_set or marker_set_key(req.markers)
            if req.markers:
                self.markers.setdefault(key, list(req.markers))
            self._adopt(req.model_copy(update={"markers": [], "marker_set": key}))
        self.following = dict(ws.following)

    def markers_of(self, job_id: str) -> list[str]:
        t = self.jobs[job_id]
        return self.markers.get(t.request.marker_set) or t.request.markers

    # ---------------------------------------------------------------- cadence
    def _followed(self, job_id: str) -> bool:
        return self.following.get(job_id, 0) > time.time()

    def interval(self) -> float:
        """Seconds between polls: the whole budget spent on evenly spaced polls (5 s at 12 a minute; never
        faster than ``watch_fast_interval_s``). Evenly spaced because under a hard cap an end that gives no
        warning is seen soonest at p95 by equal gaps (the wait's p95 is 0.95 of the gap: 4.75 s). That uses
        every slot of the window: there is no faster cadence for a build's final minutes or after an end
        (the token bucket it came from sent 20 a minute; saving slots for it would need a slower regular
        cadence, 6 s: p95 5.7 s for a failure without warning). Another request (a listing page, a detail
        read) takes a slot and so makes one gap twice as long. Queued jobs are polled like running ones: a
        job that starts is seen at the next poll."""
        pol = self.policy
        regular = max(pol.watch_fast_interval_s, 60.0 / status_limit(pol))
        # The feed names ends, not starts (a job's start writes no audit line of its own): while a watched job
        # has not been seen running, the regular cadence stays, so a start is seen at the next poll (with a
        # 15 s backstop a rebuild was cancelled 15 s into its job instead of ~5 s, after more kaniko steps).
        started = all(t.state == "running" for t in self.jobs.values() if not t.told.terminal)
        return max(regular, pol.watch_feed_backstop_s) if started and self.feed_healthy() else regular

    def regular_interval(self) -> float:
        return self.interval()

    def next_poll(self, due: float) -> float:
        """When the poll after the one that was due at ``due`` runs: one interval later, never before the
        window allows (a late poll is not caught up with a burst)."""
        return self.window.free_at(due + self.interval())

    async def _acquire(self) -> list:
        return await self.window.acquire(self.sleep)

    async def _request(self, cell: list, aw, deadline_s: float):
        """One status request in the slot ``cell``: the slot counts from its reply."""
        try:
            return await asyncio.wait_for(aw, deadline_s)
        finally:
            self.window.done(cell)

    # ---------------------------------------------------------------- one poll (one request)
    def _active(self) -> list[str]:
        return [j for j, t in self.jobs.items() if not t.told.terminal]

    async def poll(self, iris: IrisClient, *, early: bool = False) -> None:
        """One poll (``_poll``), and what it says about the feed. ``early``: the poll runs before the regular
        cadence because the feed named a job (``feed_due``); an end it finds for such a job is the feed's
        (``seen_early``, ``woke``). An end the feed has not reported waits ``watch_feed_confirm_s`` for its line
        (``misses``); a job end line followed by a poll that still sees the job running is a disagreement,
        logged loudly (the poll's state is kept)."""
        self.feed.early_polls += early
        woken, self.feed.pending = self.feed.pending, {}
        self.feed_event.clear()
        now = self.polled_at = self.clock()
        before = {j: t.seen for j, t in self.jobs.items() if not t.told.terminal}
        await self._poll(iris)
        for j, was in before.items():
            t = self.jobs.get(j)
            if t is None or not t.seen or t.seen == was:
                if t is not None and woken.get(j) in JOB_END_ACTIONS and t.seen and not _terminal(t.seen) \
                        and t.now.controller_reachable:
                    self.feed.disagreements += 1
                    activity.logger.warning(f"the controller's audit line says {j} ended ({woken[j]}), but a status "
                                            f"read after it says {t.seen}; keeping the status read")
                continue
            if not _terminal(t.seen):
                continue
            if early and j in woken:
                self.feed.seen_early += 1
                self.feed.woke = [*self.feed.woke, j][-FEED_RECENT:]
            elif j not in woken and j not in self.feed.flagged:
                self.feed.unconfirmed.setdefault(j, now)

    async def _poll(self, iris: IrisClient) -> None:
        """One status request for every watched job: ``GetJobState`` with all ids, or — when the details
        are due and one ``ListJobs`` page covers every watched job — that page, which also brings pending
        reasons and preemption counts. With more jobs (or states) than one page, the listing is read one page
        at a time beside the polls, where the window has a spare slot (``_listing_page``). Jobs whose state
        differs (or that are absent) are marked ``dirty`` for the dispatcher: details are read per change,
        never per job per interval. Every request takes a slot of the window first."""
        ids = self._active()
        if not ids:
            return
        now = self.clock()
        if not self._paged(ids) and now - self.details_at >= self.policy.watch_progress_interval_s:
            await self._poll_listing(iris, ids)
            self.details_at = now
            return
        if self._paged(ids) and now - self.page_at >= self.paged_listing_every():
            await self._listing_page(iris, ids)  # this slot's request: the next poll comes one interval later
            return
        cell = await self._acquire()
        sent = self._next_stamp()
        try:
            states = await self._request(cell, iris.job_states(ids), POLL_DEADLINE_S)
        except (Unavailable, TimeoutError) as e:
            for j in ids:
                self._unreachable(j, e)
            return
        for j in ids:
            t, state = self.jobs.get(j), states.get(j)
            if t is None:  # forgotten by the dispatcher while the request ran
                continue
            if self._stale(t, sent):
                continue
            t.seen = state.value if state is not None else t.seen
            if state is None or state.value != t.now.state or t.detail_needed or not t.now.controller_reachable:
                self.dirty.add(j)
                if state is not None:
                    self.hints[j] = state.value

    def _pairs(self, ids: list[str]) -> list[tuple[str, str]]:
        return sorted({(user_prefix(j), self.jobs[j].now.state) for j in ids
                       if self.jobs[j].now.state in (JobState.PENDING.value, JobState.RUNNING.value)})

    def _paged(self, ids: list[str]) -> bool:
        """More than one ``ListJobs`` page would list them (more jobs than a page, or other jobs under their
        common prefix, as the last listing found): the listing cannot replace a poll, so it is read a page at
        a time, for details only."""
        return len(ids) > LIST_JOBS_PAGE or (os.path.commonprefix(ids) or "/") == self.overflow_prefix

    def paged_listing_every(self) -> float:
        """Seconds between two pages of a paged listing (its cost: one request per this)."""
        return max(self.policy.watch_progress_interval_s, PAGED_LISTING_EVERY_S)

    async def _listing_page(self, iris: IrisClient, ids: list[str]) -> None:
        """One page of the paged listing, in place of a poll when due: the pending reasons and preemption counts
        of the jobs on it (their state changes are the polls' business). Pages go round the (user, state) pairs
        and their offsets. Taking a poll's slot (a sliding window has no spare one to give at the regular
        cadence) makes one gap between polls 10 s once per ``paged_listing_every`` (300 s): the wait's p95
        goes from 4.75 s to ~4.85 s. Never waits in the poll loop for a slot of its own."""
        now = self.clock()
        pairs = self._pairs(ids)
        if not pairs:
            return
        pair, offset = self.listing_at
        if pair >= len(pairs) or offset > LIST_JOBS_MAX_OFFSET:
            pair, offset = (0, 0) if pair + 1 >= len(pairs) else (pair + 1, 0)
        prefix, state = pairs[pair]
        self.page_at = now
        cell = await self._acquire()
        sent = self._next_stamp()
        try:
            page, more = await self._request(cell, iris.list_jobs_page(prefix=prefix, state=state, offset=offset),
                                             POLL_DEADLINE_S)
        except (Unavailable, TimeoutError):
            return
        self.listing_at = (pair, offset + len(page)) if more and page else (pair + 1, 0)
        for n, info in enumerate(page, 1):
            if n % YIELD_EVERY == 0:
                await asyncio.sleep(0)
            t = self.jobs.get(info.job_id)
            if t is None or t.told.terminal or self._stale(t, sent) or t.detail_needed:
                continue
            if info.state.value == t.now.state and t.now.controller_reachable:
                t.now = _progress(info, t.now)

    async def _poll_listing(self, iris: IrisClient, ids: list[str]) -> None:
        """The once-a-minute listing as a poll, in one request: one ``ListJobs`` page of every state under the
        watched jobs' common prefix. When that page holds them all (no page follows), it is a complete poll: a
        job listed in another state changed (its new state is taken as it is, as from ``GetJobState``), a job
        not listed vanished (read alone, to confirm it). Before, the listing asked per state and a changed job's
        new state took one more ``GetJobState``: a second slot of the window, so the next poll came 10 s later
        once a minute (end→seen p95 6.3-8.4 s at 10-200 jobs). When more pages would follow (other jobs under
        the prefix: several builds at once), the listed jobs are taken as listed, the others are seen by the next
        poll, and this prefix is listed a page at a time from then on (``_paged``)."""
        prefix = os.path.commonprefix(ids) or "/"
        cell = await self._acquire()
        sent = self._next_stamp()
        try:
            page, more = await self._request(cell, iris.list_jobs_page(prefix=prefix), POLL_DEADLINE_S * 2)
        except (Unavailable, TimeoutError) as e:
            for j in ids:
                self._unreachable(j, e)
            return
        if more:
            self.overflow_prefix = prefix
        listed = {i.job_id: i for i in page}
        for n, j in enumerate(ids, 1):
            if n % YIELD_EVERY == 0:
                await asyncio.sleep(0)  # thousands of jobs: let the worker's other work run in between
            t, info = self.jobs.get(j), listed.get(j)
            if t is None or self._stale(t, sent):
                continue
            if info is None:
                if not more:  # a complete listing without it: gone? confirmed alone before it is reported
                    t.seen = ""
                    self.dirty.add(j)
                continue
            t.seen = info.state.value
            if info.state.value == t.now.state and not t.detail_needed and t.now.controller_reachable:
                t.now = _progress(info, t.now)
            else:
                self.hints[j] = info.state.value
                self.dirty.add(j)

    async def dispatch(self, iris: IrisClient) -> list[str]:
        """Read the details of every dirty job — batched: one ``ListJobs`` per (common prefix, new state)
        when several changed to the same state, ``GetJobStatus`` for the rest — and return them."""
        job_ids = [j for j in self.dirty if j in self.jobs]
        self.dirty.clear()
        if not job_ids:
            return []
        began = self._next_stamp()
        for j in job_ids:
            self.jobs[j].reading, self.jobs[j].read_stamp = True, began
        try:
            await self._read_details(iris, job_ids)
        finally:
            for j in job_ids:
                if j in self.jobs:
                    self.jobs[j].reading = False
        return job_ids

    async def _read_details(self, iris: IrisClient, job_ids: list[str]) -> None:
        """A job whose new state a poll reported (``GetJobState``, the controller's own state) takes it as it
        is, with no further request: the target acts on the state (its log check, or the capture that reads
        the job's error and attempts), so a detail read would only delay the wake-up by a round trip and
        spend the status budget the polls need. Read one by one (``GetJobStatus``): a job the poll did not
        list (vanished? confirmed before it is reported missing) or whose state is not known yet."""
        singles: list[str] = []
        for j in job_ids:
            hint = self.hints.pop(j, "")
            if hint:
                self._take_state(j, hint)
            else:
                singles.append(j)
        sem = asyncio.Semaphore(DETAIL_CONCURRENCY)

        async def one(j: str) -> None:
            async with sem:
                await self._details(iris, j)
                self.on_progress()
        await asyncio.gather(*(one(j) for j in singles))

    def _take_state(self, job_id: str, state: str) -> None:
        t = self.jobs.get(job_id)
        if t is None:
            return
        parsed = JobState.parse(state)
        update: dict = dict(state=parsed.value, terminal=parsed.is_terminal, controller_reachable=True)
        if parsed.value != t.now.state:
            update["pending_reason"] = None  # the listing poll brings the new state's reason
        if not t.now.controller_reachable:
            update["error"] = None
        t.now, t.detail_needed = t.now.model_copy(update=update), False

    async def _details(self, iris: IrisClient, job_id: str) -> None:
        t = self.jobs.get(job_id)
        if t is None:
            return
        cell = await self._acquire()
        try:
            info = await self._request(cell, iris.job_status(job_id, with_tasks=False), POLL_DEADLINE_S)
            t.now = _progress(info, t.now)
            t.detail_needed = False
        except NotFound:
            t.now = t.now.model_copy(update=dict(
                state="missing", terminal=True, missing=True, controller_reachable=True,
                error=f"{job_id} is no longer known to the controller (pruned?); not a success"))
            t.detail_needed = False
        except (Unavailable, TimeoutError) as e:
            self._unreachable(job_id, e)
            t.detail_needed = True  # read again on the next poll

    def _unreachable(self, job_id: str, err: Exception) -> None:
        t = self.jobs.get(job_id)
        if t is None:
            return
        t.now = t.now.model_copy(update=dict(controller_reachable=False,
                                             error=f"controller unreachable: {err or type(err).__name__}"))

    # ---------------------------------------------------------------- the controller's audit feed
    def feed_healthy(self) -> bool:
        """The feed is trusted: its last read succeeded within FEED_STALE_S and it has not missed an end lately."""
        now = self.clock()
        f = self.feed
        return (f.state == "ok" and now - f.ok_at <= FEED_STALE_S + self.policy.watch_feed_interval_s
                and now >= f.degraded_until)

    def feed_due(self) -> float:
        """When a poll may run for the jobs the feed named (inf: none named, or the feed is not trusted): when the
        window has a slot, never sooner than FEED_MIN_GAP_S after the last poll, and the fewer slots the window has
        left, the longer the gap: (60 / limit) x used / limit, so a stream of ends spends the free slots fast at
        first and then ever closer to the evenly spaced cadence (at 12 a minute with 9 slots free: gaps of
        1.25 s growing to 4.6 s, ~26 s for all 9; a longer stream then waits for the window)."""
        if not self.feed.pending or not self.feed_healthy():
            return float("inf")
        limit = self.window.limit
        gap = max(FEED_MIN_GAP_S, 60.0 / limit * (limit - self.window.free()) / limit)
        return self.window.free_at(self.polled_at + gap)

    async def read_feed(self, iris: IrisClient) -> int:
        """New audit lines of the controller (``/system/controller``, from the feed cursor; domain/controller_feed.py):
        a line about a watched job, a task of one, or a failed worker marks the job(s) for the next poll
        (``feed.pending``) and sets ``feed_event``. Returns the requests made. Raises what the read raised.
        Reads nothing where ``policy.watch_feed`` is false (the feed stays ``off``: polls only)."""
        if not self._active() or not self.policy.watch_feed:
            return 0
        requests = 0
        try:
            for _ in range(FEED_PAGES_PER_READ):
                requests += 1
                self.feed.requests += 1
                page = await asyncio.wait_for(iris.fetch_logs(
                    CONTROLLER_LOG_KEY, "exact", cursor=self.feed_cursor or None, since_ms=self.feed_since_ms,
                    max_lines=FEED_PAGE, substring=AUDIT_SUBSTRING), FEED_DEADLINE_S)
                for e in page.entries:
                    ev = parse_audit_line(e.data, source=e.source)
                    if ev is not None:
                        self._feed_event(ev)
                advanced = bool(page.entries) and page.cursor > self.feed_cursor
                if advanced:
                    self.feed_cursor = page.cursor
                if not advanced or len(page.entries) < FEED_PAGE:
                    break
        except Exception as e:
            self.feed_failed(e)
            raise
        now = self.clock()
        self.feed.failures = 0
        if not self.feed.audit_lines:
            self.feed.state, self.feed.error = "unproven", ""
        elif self.feed.state != "ok" and now >= self.feed.degraded_until:
            if self.feed.state not in ("off", "unproven"):
                activity.logger.info("the controller's audit feed is read again; polls follow it")
            self.feed.state, self.feed.error = "ok", ""
        self.feed.ok_at = now
        pol = self.policy
        late = [j for j, at in self.feed.unconfirmed.items() if now - at > pol.watch_feed_confirm_s]
        if late:
            for j in late:
                del self.feed.unconfirmed[j]
            self.feed.misses += len(late)
            self.feed.degraded_until = now + pol.watch_feed_penalty_s
            if self.feed.state == "ok":
                self.feed.error = (f"{len(late)} end(s) found by a poll were not in the controller's audit feed within "
                                   f"{pol.watch_feed_confirm_s:.0f} s (e.g. {late[0]})")
                activity.logger.warning(f"{self.feed.error}; polling at the regular cadence for "
                                        f"{pol.watch_feed_penalty_s:.0f} s")
            self.feed.state = "missed"
        self.feed.flagged = {j: at for j, at in self.feed.flagged.items() if now - at <= pol.watch_feed_penalty_s}
        if self.feed.pending:
            self.feed_event.set()
        return requests

    def _feed_event(self, ev: AuditEvent) -> None:
        now = self.clock()
        self.feed.audit_lines += 1
        if ev.action in WORKER_ACTIONS:
            named = self._active()
        else:
            job = ev.job_id()
            self.feed.unconfirmed.pop(job or "", None)
            named = [job] if job in self.jobs and not self.jobs[job].told.terminal else []
        for j in named:
            self.feed.pending[j] = ev.action
            self.feed.flagged[j] = now
        self.feed.lines += bool(named)

    def feed_failed(self, err: BaseException) -> None:
        """A failed feed read: logged once per failing stretch, the regular cadence until a read succeeds, which is
        tried again after ``feed_retry_in`` (growing: a controller whose log store fails is not asked every second)."""
        why = f"{type(err).__name__}: {err}"[:300]
        if self.feed.state != "failing":
            activity.logger.warning(f"the controller's audit feed is not readable ({why}); polling at the regular "
                                    "cadence until it is, and reading it again after 1, 2, 4 ... s (at most "
                                    f"{self.policy.watch_feed_retry_max_s:g} s)")
        self.feed.state, self.feed.error = "failing", why
        self.feed.failures += 1

    def feed_retry_in(self) -> float:
        """Seconds until the next feed read: the interval, or after failures 1, 2, 4 ... intervals (at most
        ``watch_feed_retry_max_s``)."""
        pol = self.policy
        if not self.feed.failures:
            return pol.watch_feed_interval_s
        return min(pol.watch_feed_retry_max_s, pol.watch_feed_interval_s * 2.0 ** (self.feed.failures - 1))

    # ---------------------------------------------------------------- logs: one prefix read per cluster
    def logs_due(self) -> bool:
        running = [j for j in self._active() if self.jobs[j].now.state == JobState.RUNNING.value
                   and self.markers_of(j)]
        if not running:
            return False
        every = (self.policy.watch_follow_interval_s if any(self._followed(j) for j in running)
                 else self.policy.watch_log_interval_s)
        return self.clock() - self.log_at >= every

    async def read_logs(self, iris: IrisClient) -> int:
        """New lines of every running job with one ``FetchLogs`` (the jobs' common prefix) from the log
        store's global cursor, routed to jobs by key; the latest build marker of each is progress.
        Returns the requests made (more than one only when a page came back full)."""
        running = [j for j in self._active() if self.jobs[j].now.state == JobState.RUNNING.value]
        self.log_at = self.clock()
        if not running:
            return 0
        prefix = common_prefix(running)
        requests = 0
        for _ in range(LOG_PAGES_PER_READ):
            requests += 1
            page = await iris.fetch_logs(prefix, "prefix", cursor=self.log_cursor or None,
                                         since_ms=self.log_since_ms, max_lines=LOG_PAGE)
            for e in page.entries:
                job_id = e.task_id.rsplit("/", 1)[0] if e.task_id else ""
                t = self.jobs.get(job_id)
                if t is None or t.told.terminal:
                    continue
                for m in self.markers_of(job_id):
                    if m in e.data:
                        t.now = t.now.model_copy(update={"last_marker": m})
            advanced = bool(page.entries) and page.cursor > self.log_cursor
            if advanced:
                self.log_cursor = page.cursor
            if not advanced or len(page.entries) < LOG_PAGE:
                break
        for n, j in enumerate(running, 1):
            if n % YIELD_EVERY == 0:
                await asyncio.sleep(0)
            t = self.jobs.get(j)
            if t is not None and t.now.log_cursor != self.log_cursor:
                t.now = t.now.model_copy(update={"log_cursor": self.log_cursor})
        return requests

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
            self.unreported[job_id] = t.told

    def take_unreported(self) -> list[list[JobProgress]]:
        """What targets were told since the last report, in batches of TOLD_BATCH (the ``told`` signal)."""
        told, self.unreported = list(self.unreported.values()), {}
        return [told[i:i + TOLD_BATCH] for i in range(0, len(told), TOLD_BATCH)]

    def finished(self) -> list[str]:
        """Jobs whose terminal state the target has been told: nothing more to watch."""
        return [j for j, t in self.jobs.items() if t.told.terminal]

    def forget(self, job_ids: list[str]) -> None:
        for j in job_ids:
            self.jobs.pop(j, None)
            self.following.pop(j, None)

    # ---------------------------------------------------------------- heartbeat (bounded)
    def details(self) -> dict:
        """Heartbeat details: counters, the resume state (revision, log cursor) and the live progress of
        followed jobs only (at most FOLLOW_VIEW_MAX), whatever the number of watched jobs."""
        live = {}
        for j in sorted((j for j in self.jobs if self._followed(j)), key=lambda j: -self.following[j]):
            if len(live) >= FOLLOW_VIEW_MAX:
                break
            t = self.jobs[j]
            live[j] = {"registered_at": t.request.registered_at, "told": t.told.model_dump(mode="json"),
                       "now": t.now.model_dump(mode="json")}
        states: dict[str, int] = {}
        for t in self.jobs.values():
            states[t.now.state] = states.get(t.now.state, 0) + 1
        return {"jobs": live, "watched": len(self.jobs), "states": states, "rev": self.rev,
                "log_cursor": self.log_cursor, "log_since_ms": self.log_since_ms,
                "status_sent_ago": self.window.ages(), "feed_cursor": self.feed_cursor,
                "feed_since_ms": self.feed_since_ms, "feed": self.feed.view()}

    def resume(self, details: dict | None) -> None:
        """Start from the last heartbeat of a crashed attempt: the log is not re-read from the start."""
        d = details or {}
        self.log_cursor = int(d.get("log_cursor") or 0)
        self.log_since_ms = int(d.get("log_since_ms") or self.log_since_ms)
        # The feed goes on after the last audit line the crashed attempt read (a line read twice only wakes a poll).
        self.feed_cursor = int(d.get("feed_cursor") or 0)
        self.feed_since_ms = int(d.get("feed_since_ms") or self.feed_since_ms)
        # The status requests the crashed attempt sent in its last minute still count (on another worker too).
        self.window.restore(d.get("status_sent_ago") or [])


class WatchActivities(ActivityGroup):
    """``watch_job`` (per target, once per job and per safety interval) and ``watch_cluster`` (the loop)."""

    def __init__(self, config: ServiceConfig, *, transport: httpx.AsyncBaseTransport | None = None):
        super().__init__(config)
        self._transport = transport  # e.g. a recording transport in tests; None: plain HTTP

    def all(self) -> list:
        return [self.watch_job, self.watch_cluster]

    @activity.defn
    async def watch_job(self, inp: WatchJobInput) -> JobProgress:
        """Register the job with its cluster's watcher (signal-with-start: the watcher is started when none
        runs) and return what is known of it. Idempotent: a re-registration replaces the previous one. The
        marker texts go to a watcher run once per contract (``_register``); a registration names their key.

        Sends no request to the controller: every status request of a cluster is the watcher's and takes a
        slot of its ``StatusWindow`` (``policy.watch_status_budget_per_min`` in any sliding minute). Before,
        each registration read ``GetJobStatus`` outside that window: 200 targets starting together sent 200
        status requests in a minute on top of the watcher's 12 (issue 37). A first registration returns the
        state as ``unknown``; the watcher's next poll (one interval, 5 s) reads it and wakes the target with it,
        a job that has already ended included.

        A safety re-check (``known`` set) looks at the watcher's heartbeat: when the watcher is alive and has
        told this target what it knows, the watcher's live progress is returned. Otherwise (no watcher, a stale
        heartbeat, a record that disagrees) the job is registered again with ``known``: that starts a closed
        watcher, and makes a running one re-send anything that differs from ``known`` (``ClusterWatch._adopt``);
        a watcher whose poll activity is stuck is retried by its own heartbeat timeout.

        Heartbeats throughout: a slow Temporal under a start of hundreds of targets makes a slow registration
        (bounded: REGISTER_ATTEMPTS), never a heartbeat timeout."""
        async with Heartbeater(HEARTBEAT_EVERY_S):
            return await self._watch_job(inp)

    async def _watch_job(self, inp: WatchJobInput) -> JobProgress:
        if inp.known is not None:
            seen = await _watched_progress(activity.client(), inp.cluster, activity.info().task_queue, inp.job_id,
                                           inp.known)
            if seen is not None:
                return seen
            activity.logger.warning(f"the {inp.cluster} watcher has no fresh record of {inp.job_id}; registering "
                                    "it again (the watcher re-reads it on its next poll)")
        progress = (inp.known or JobProgress(job_id=inp.job_id, state="unknown", terminal=False)).model_copy()
        if progress.terminal:
            return progress  # nothing to watch
        await _register(activity.client(), watcher_id(inp.cluster, activity.info().task_queue), inp, progress)
        return progress

    @activity.defn
    async def watch_cluster(self, inp: WatchClusterInput) -> WatchClusterResult:
        """Poll every watched job of the cluster until none is left (or ``return_after_s``); wake targets.

        Ends when the watch set stays empty for two intervals, when the worker shuts down (the workflow
        starts it again elsewhere), after ``return_after_s``, or when the workflow's history is long
        enough to continue as new. A stalled loop raises (retried at once by the workflow's policy)."""
        pol = self.config.policy
        client = activity.client()
        me = client.get_workflow_handle(activity.info().workflow_id)
        # Job states carry Iris error text (a task's stderr): the signals below are redacted, so learn
        # every configured credential first (this worker may never have fetched them).
        await asyncio.to_thread(self.learn_secrets_once)
        window = _WINDOWS.setdefault(inp.cluster, StatusWindow(status_limit(pol)))
        window.limit = status_limit(pol)
        engine = ClusterWatch(pol, window=window)
        result = WatchClusterResult()
        details = activity.info().heartbeat_details
        engine.resume(details[0] if details else None)
        first = await _read_changes_at_start(me, engine)
        if _replaced(first):
            return result  # an attempt of a run that has continued as new: the new run's activity watches
        if first.adopting:
            await _adopt_previous(client, me, first.adopting)
            await _read_changes(me, engine)
        async with _Watchdog(engine) as beat, \
                iris_client(self.config, inp.cluster, transport=self._transport) as iris:
            beat.details = {**engine.details(), "polls": 0, "requests": {}}
            tasks = [asyncio.create_task(_read_logs(engine, iris, beat)),
                     asyncio.create_task(_dispatcher(engine, iris, client, me, beat)),
                     asyncio.create_task(_read_feed(engine, iris))]
            try:
                return await self._poll_loop(inp, engine, iris, beat, me, result)
            finally:
                for t in tasks:
                    t.cancel()
                for t in tasks:
                    with contextlib.suppress(asyncio.CancelledError):
                        await t
                with contextlib.suppress(RPCError, asyncio.CancelledError):
                    await _report_told(me, engine)

    async def _poll_loop(self, inp: WatchClusterInput, engine: ClusterWatch, iris: IrisClient, beat: _Watchdog,
                         me, result: WatchClusterResult) -> WatchClusterResult:
        """Poll at the cadence, read the watch set's changes beside it (``_changes_beside``)."""
        started, empty_polls = time.monotonic(), 0
        next_poll = time.monotonic()
        early = False  # this poll runs before the regular cadence because the feed named a job
        changes: asyncio.Task | None = None
        try:
            while True:
                beat.step("poll")
                # Poll first: the changes it finds go to the dispatcher (details, wake-ups) beside this loop.
                await engine.poll(iris, early=early)
                beat.step("poll")
                if engine.dirty:
                    beat.wake.set()
                result.polls += 1
                result.requests = dict(iris.requests)
                beat.details = {**engine.details(), "polls": result.polls, "requests": result.requests,
                                "signals": result.signals + beat.signals}
                if time.monotonic() - started >= inp.return_after_s or activity.is_worker_shutdown():
                    break
                empty_polls = empty_polls + 1 if not engine.jobs else 0
                beat.step(None)
                # The watch set's changes are read CHANGES_LEAD_S before each regular poll, beside the wait, and
                # the poll never waits for them: a job registered meanwhile is in this poll when the read is done
                # by then, and a replaced run is noticed before it polls again. Before, the poll waited for the
                # read, and under load the ``changes`` query timed out (5 s) several times a minute: each
                # such poll came 5 s late, a 10 s gap in detection (bench/monitoring.py, issue 37).
                # A line of the controller's audit feed about a watched job brings the poll forward
                # (``feed_due``, inside the same window); the regular poll is then one interval after it.
                stop = False
                while True:
                    regular = engine.next_poll(next_poll)
                    at = min(regular, engine.feed_due())
                    now = time.monotonic()
                    if changes is None and now >= regular - CHANGES_LEAD_S:
                        changes = asyncio.create_task(_changes_beside(me, engine, beat))
                    if now >= at:
                        break
                    stop = await _until(at if changes is not None else min(at, regular - CHANGES_LEAD_S),
                                        engine.feed_event)
                    if stop:
                        break
                    engine.feed_event.clear()
                if stop:
                    break
                early = at < regular
                next_poll = time.monotonic() if early else regular
                if changes is not None and changes.done():
                    page, changes = changes.result(), None
                    if page is not None and (page.continue_suggested or _replaced(page)):
                        break
                if engine.jobs:
                    empty_polls = 0
                if empty_polls >= 2:
                    break
        finally:
            if changes is not None:
                changes.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await changes
        result.signals += beat.signals
        return result


CHANGES_LEAD_S = 1.5  # the watch set's changes are read this long before a poll is due


async def _until(t: float, event: asyncio.Event | None = None) -> bool:
    """Wait until monotonic ``t``, the worker's shutdown or ``event`` (when given); True when the worker is
    shutting down."""
    waits = [asyncio.ensure_future(activity.wait_for_worker_shutdown())]
    if event is not None:
        waits.append(asyncio.ensure_future(event.wait()))
    try:
        await asyncio.wait(waits, timeout=max(0.0, t - time.monotonic()), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
    return activity.is_worker_shutdown()


async def _changes_beside(me, engine: ClusterWatch, beat: _Watchdog) -> WatchPage | None:
    """Read the watch set's changes beside the poll loop (its own watchdog step); None when not readable
    now (the last ones are kept, read again before the next poll)."""
    beat.step("changes", loop="changes")
    try:
        return await _read_changes(me, engine, on_page=lambda: beat.step("changes", loop="changes"))
    except RPCError as e:
        activity.logger.warning(f"watch set changes not readable, keeping the last ones: {e}")
        return None
    finally:
        beat.step(None, loop="changes")


def _replaced(page: WatchPage) -> bool:
    """The watch set was read from a newer run than this activity's: its run continued as new and the new
    run's activity watches now. This one's cancellation would reach it only with a heartbeat reply, seconds
    later, and two watchers would read and signal every change twice meanwhile: it stops at once."""
    if page.run_id and page.run_id != activity.info().workflow_run_id:
        activity.logger.info(f"watcher run {page.run_id} has replaced this activity's run; stopping")
        return True
    return False


class _Watchdog(Heartbeater):
    """Heartbeats in the background only while the loops make progress: a step (a poll iteration, a
    dispatch) that runs past STALL_S stops the heartbeat and fails the activity, so Temporal starts a
    fresh attempt at once instead of trusting a watcher that no longer polls."""

    def __init__(self, engine: ClusterWatch):
        super().__init__(HEARTBEAT_EVERY_S)
        self.engine = engine
        self.steps: dict[str, float] = {}  # loop -> monotonic start of its current step
        self.wake = asyncio.Event()  # the dispatcher has work
        self.signals = 0
        self._main: asyncio.Task | None = None

    def step(self, name: str | None, loop: str = "poll") -> None:
        if name is None:
            self.steps.pop(loop, None)
        else:
            self.steps[loop] = time.monotonic()

    def stalled(self) -> str | None:
        now = time.monotonic()
        for loop, since in self.steps.items():
            if now - since > STALL_S:
                return f"the watcher's {loop} step has run {now - since:.0f}s (> {STALL_S:.0f}s)"
        return None

    async def _loop(self) -> None:
        while True:
            why = self.stalled()
            if why:
                activity.logger.warning(f"watcher stalled: {why}; ending this attempt")
                if self._main is not None:
                    self._main.cancel(msg=why)
                return
            if activity.in_activity():
                activity.heartbeat(redact_obj(self.details))
            await asyncio.sleep(min(self.every_s, 1.0))

    async def __aenter__(self) -> _Watchdog:
        self._main = asyncio.current_task()
        return await super().__aenter__()

    async def __aexit__(self, exc_type, exc, tb) -> None:
        await super().__aexit__(exc_type, exc, tb)
        if exc_type is asyncio.CancelledError and self.stalled():
            raise ApplicationError(f"watcher stalled: {self.stalled()}", type="WatcherStalled") from None


REGISTER_BATCH = 200  # registrations per signal (~400 bytes each with the marker key only: ~80 KB)
REGISTER_ATTEMPTS = 5  # signal-with-start tries before the registration fails (Transient: the activity retries)
REGISTER_RPC_S = 10.0  # one signal-with-start's bound
# A batch waits this long for more registrations before it is sent: targets starting together register over a
# few seconds (each reads its job first), so without it most batches would hold one registration.
REGISTER_LINGER_S = 0.5
REGISTER_RETRYABLE = (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.RESOURCE_EXHAUSTED,
                      RPCStatusCode.CANCELLED, RPCStatusCode.ABORTED, RPCStatusCode.INTERNAL)


@dataclass
class _Pending:
    inp: WatchJobInput
    progress: JobProgress
    done: asyncio.Future


class _Registrations:
    """Registrations with a cluster's watcher, batched per watcher id in this worker: while one
    signal-with-start is in flight (or for REGISTER_LINGER_S before one is sent), every registration that
    arrives waits and goes in the next one (a ``watch_many`` signal of up to REGISTER_BATCH), so 200 targets starting together cost a handful of
    signals on the watcher's one workflow, not 200 contending for its lock (26 of 200 timed out that way).

    Each signal-with-start is bounded (REGISTER_RPC_S) and retried at most REGISTER_ATTEMPTS times on a
    transient status; it is idempotent: a registration replaces the job's entry with the same request, so
    one that landed although its reply was lost changes nothing when sent again. The marker texts go to a
    watcher run once: inline in the first registration of their key sent to the run, else the key only;
    signal-with-start names the run that got them, and a run this worker did not give the texts (a
    continued-as-new, restarted or new watcher) gets them in one ``markers`` signal."""

    def __init__(self) -> None:
        self.pending: dict[str, list[_Pending]] = {}
        self.flushing: set[str] = set()
        self.signals = 0  # signal-with-starts sent (tests)
        self._tasks: set[asyncio.Task] = set()

    async def register(self, client: Client, wid: str, task_queue: str, inp: WatchJobInput,
                       progress: JobProgress) -> None:
        done = asyncio.get_running_loop().create_future()
        self.pending.setdefault(wid, []).append(_Pending(inp, progress, done))
        if wid not in self.flushing:
            self.flushing.add(wid)
            task = asyncio.create_task(self._flush(client, wid, task_queue))
            self._tasks.add(task)  # a reference: the loop holds tasks weakly
            task.add_done_callback(self._tasks.discard)
        await asyncio.shield(done)

    async def _flush(self, client: Client, wid: str, task_queue: str) -> None:
        try:
            while self.pending.get(wid):
                await asyncio.sleep(REGISTER_LINGER_S)
                batch, self.pending[wid] = self.pending[wid][:REGISTER_BATCH], self.pending[wid][REGISTER_BATCH:]
                try:
                    await self._send(client, wid, task_queue, batch)
                except BaseException as e:  # noqa: BLE001 - handed to every waiting registration
                    err = e if isinstance(e, Exception) else Transient(f"registration with {wid} interrupted")
                    for p in batch:
                        if not p.done.done():
                            p.done.set_exception(err)
                    if not isinstance(e, Exception):
                        raise
                else:
                    for p in batch:
                        if not p.done.done():
                            p.done.set_result(None)
        finally:
            self.flushing.discard(wid)
            if not self.pending.get(wid):
                self.pending.pop(wid, None)

    async def _send(self, client: Client, wid: str, task_queue: str, batch: list[_Pending]) -> None:
        cluster = batch[0].inp.cluster
        run_id, given = _MARKERS_SENT.get(wid, ("", set()))
        texts: dict[str, list[str]] = {}
        requests = []
        for p in batch:
            key = marker_set_key(p.inp.markers)
            inline = bool(key) and key not in given and key not in texts
            if key:
                texts.setdefault(key, p.inp.markers)
            requests.append(WatchRequest(job_id=p.inp.job_id, workflow_id=p.inp.workflow_id,
                                         markers=p.inp.markers if inline else [], marker_set=key, known=p.progress,
                                         registered_at=p.inp.registered_at))
        delay = 0.5
        for attempt in range(1, REGISTER_ATTEMPTS + 1):
            try:
                handle = await client.start_workflow(
                    "IrisWatcherWorkflow", WatcherInput(cluster=cluster), id=wid,
                    task_queue=watcher_task_queue(task_queue), start_signal="watch_many",
                    start_signal_args=[requests], id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
                    rpc_timeout=timedelta(seconds=REGISTER_RPC_S),
                    static_summary=f"Iris watcher for cluster {cluster}: one status request per interval for every "
                                   "running job, targets woken on change")
                break
            except RPCError as e:
                if e.status not in REGISTER_RETRYABLE or attempt == REGISTER_ATTEMPTS:
                    if e.status in REGISTER_RETRYABLE:
                        raise Transient(f"registering {len(requests)} job(s) with {wid} failed {attempt} times "
                                        f"({e.message}); the activity retries") from None
                    raise
                activity.logger.warning(f"registering {len(requests)} job(s) with {wid}: {e.message}; "
                                        f"try {attempt + 1} of {REGISTER_ATTEMPTS} in {delay:.1f} s")
                await asyncio.sleep(delay)
                delay *= 2
        self.signals += 1
        if handle.result_run_id != run_id:  # another run: what it was given is not known here
            run_id, given = handle.result_run_id or "", set()
            inline_keys = {r.marker_set for r in requests if r.markers}
            for key, markers in texts.items():
                if key in inline_keys:
                    continue
                try:
                    await client.get_workflow_handle(wid).signal("markers", MarkerSet(key=key, markers=markers),
                                                                 rpc_timeout=timedelta(seconds=REGISTER_RPC_S))
                except RPCError as e:
                    if e.status != RPCStatusCode.NOT_FOUND:  # closed since: nothing left to mark
                        raise
        given.update(texts)
        _MARKERS_SENT[wid] = (run_id, given)


_REGISTRATIONS = _Registrations()


async def _register(client: Client, wid: str, inp: WatchJobInput, progress: JobProgress,
                    task_queue: str | None = None) -> None:
    """Register a job with its cluster's watcher (batched, see ``_Registrations``)."""
    await _REGISTRATIONS.register(client, wid, task_queue or activity.info().task_queue, inp, progress)


async def _read_changes(me, engine: ClusterWatch, on_page: Callable[[], None] = lambda: None) -> WatchPage:
    """Apply every page of the workflow's changes after the engine's revision (one small page when
    nothing changed)."""
    while True:
        page = await me.query("changes", PageRequest(since=engine.rev), result_type=WatchPage,
                              rpc_timeout=timedelta(seconds=RPC_DEADLINE_S))
        engine.apply(page)
        on_page()
        if not page.more:
            return page


# A query times out (CANCELLED "Timeout expired" / DEADLINE_EXCEEDED) while the workflow's worker has just
# gone (a rolling deploy: its sticky queue still holds the task), or while the frontend is restarting.
QUERY_RETRYABLE = (RPCStatusCode.CANCELLED, RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.UNAVAILABLE)
START_READ_BOUND_S = 60.0


async def _read_changes_at_start(me, engine: ClusterWatch, *, bound_s: float = START_READ_BOUND_S,
                                 sleep: Callable[[float], object] = asyncio.sleep) -> WatchPage:
    """The first read of the watch set, retried in place (heartbeating, a warning per try) while the query
    times out, for at most ``bound_s``; then ``Transient``: retried by the activity's policy, visibly."""
    started, delay = time.monotonic(), 1.0
    while True:
        try:
            return await _read_changes(me, engine)
        except RPCError as e:
            if e.status not in QUERY_RETRYABLE:
                raise
            if time.monotonic() - started + delay > bound_s:
                raise Transient(f"the watch set of {me.id} was not readable for {bound_s:.0f} s ({e.message}); "
                                "retrying the watcher") from None
            activity.logger.warning(f"watch set not readable yet ({e.message}); reading again in {delay:.0f} s")
        if activity.in_activity():
            activity.heartbeat()
        await sleep(delay)
        delay = min(delay * 2, 8.0)


async def _adopt_previous(client: Client, me, run_id: str) -> None:
    """Hand the previous (closed) run's watch set to the current run, page by page: query the closed
    run, signal each page as an ``adopt`` chunk (the last one ``done``). Idempotent: the workflow keeps
    what it already holds, so a retried adoption changes nothing."""
    prev = client.get_workflow_handle(me.id, run_id=run_id)
    since = 0
    while True:
        page = await prev.query("changes", PageRequest(since=since, budget_bytes=ADOPT_PAGE_BUDGET_BYTES),
                                result_type=WatchPage)
        since = page.next
        await me.signal("adopt", AdoptChunk(from_run_id=run_id, watches=page.watches, marker_sets=page.marker_sets,
                                            following=page.following, done=not page.more))
        if not page.more:
            return


async def _report_told(me, engine: ClusterWatch) -> None:
    """Tell the workflow what targets were told (batches), so a restart starts from it; kept for the
    next try when the signal fails."""
    for batch in engine.take_unreported():
        try:
            await me.signal("told", [redact_value(p) for p in batch], rpc_timeout=timedelta(seconds=RPC_DEADLINE_S))
        except RPCError:
            for p in batch:
                engine.unreported.setdefault(p.job_id, p)
            raise


async def _dispatcher(engine: ClusterWatch, iris: IrisClient, client: Client, me, beat: _Watchdog) -> None:
    """Beside the poll loop: read the details of changed jobs (batched), start the wake-ups of their targets
    (``_Waker``: each on its own, never waiting for an earlier round), report what they were told and drop
    finished watches. Every completed request counts as progress for the watchdog."""
    engine.on_progress = lambda: beat.step("dispatch", loop="dispatch")
    waker = _Waker(client, engine, beat)
    try:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(beat.wake.wait(), 1.0)
            beat.wake.clear()
            beat.step("dispatch", loop="dispatch")
            try:
                await engine.dispatch(iris)
                waker.start()
                finished = engine.finished()
                await _report_told(me, engine)
                engine.forget(finished)
            except RPCError as e:
                activity.logger.warning(f"could not report to the watcher workflow: {e}")
            finally:
                beat.step(None, loop="dispatch")
    finally:
        await waker.close()


async def _read_logs(engine: ClusterWatch, iris: IrisClient, beat: _Watchdog) -> None:
    """Log reads run beside the poll loop: one prefix read per interval; a new marker is picked up by
    the dispatcher's next round of wake-ups."""
    while True:
        if engine.logs_due():
            try:
                await engine.read_logs(iris)
            except Exception as e:  # noqa: BLE001 - progress only: never stop watching over a log read
                activity.logger.warning(f"log progress read failed: {e}")
            if engine.wakeups():
                beat.wake.set()
        await asyncio.sleep(1.0)


async def _read_feed(engine: ClusterWatch, iris: IrisClient) -> None:
    """Beside the poll loop: the controller's audit lines, one read per ``watch_feed_interval_s`` while jobs are
    watched (backing off while reads fail: ``feed_retry_in``). A
    line about a watched job sets ``engine.feed_event``, which the poll loop waits on beside its timer. A failing
    read is the engine's ``feed_failed`` (logged once; the regular cadence meanwhile), never the watcher's end."""
    while True:
        with contextlib.suppress(Exception):  # recorded by read_feed (feed.state/error)
            await engine.read_feed(iris)
        await asyncio.sleep(engine.feed_retry_in())


class _Waker:
    """The wake-ups in flight, one task per target (at most SIGNAL_CONCURRENCY sending at once): a state change
    (an end above all) goes as the target's ``wake`` update, progress as the ``job_changed`` signal (see
    ``_wake_now``). A target that no longer runs is dropped; a transient failure is retried on the next round
    (the target is not marked as told).

    Why not rounds: a round (``gather`` of every wake-up due) ended with its slowest wake-up (an update waits for
    the target's workflow task, bounded by RPC_DEADLINE_S, then the signal), and an end seen meanwhile waited
    behind it. With the audit feed ends are seen a few at a time, so that wait repeated: seen → signal p95
    9-25 s at 200 targets under load (issue 37, docs/benchmarks.md). Now a wake-up starts as soon as its end is
    seen. A target's next wake-up waits for its previous one (a later state never overtakes an earlier one);
    each completion wakes the dispatcher (``beat.wake``) to report it and start what is due."""

    def __init__(self, client: Client, engine: ClusterWatch, beat: _Watchdog):
        self.client, self.engine, self.beat = client, engine, beat
        self.sem = asyncio.Semaphore(SIGNAL_CONCURRENCY)
        self.inflight: dict[str, asyncio.Task] = {}
        # job -> (failed tries, not before): a wake-up that failed (not NOT_FOUND) is tried again after 1, 2, 4 ...
        # up to WAKE_RETRY_MAX_S, so a target that cannot be reached never makes the dispatcher spin.
        self.retry: dict[str, tuple[int, float]] = {}

    def start(self) -> int:
        """Start a wake-up for every target with something new and none in flight; how many were started."""
        started = 0
        now = time.monotonic()
        self.retry = {j: r for j, r in self.retry.items() if j in self.engine.jobs}
        for workflow_id, progress in self.engine.wakeups():
            if progress.job_id in self.inflight or self.retry.get(progress.job_id, (0, 0.0))[1] > now:
                continue
            t = self.engine.jobs.get(progress.job_id)
            task = asyncio.create_task(self._one(workflow_id, progress, t is None or is_state_change(t.told, progress)))
            self.inflight[progress.job_id] = task
            task.add_done_callback(lambda _t, j=progress.job_id: self._done(j))
            started += 1
        return started

    def _done(self, job_id: str) -> None:
        self.inflight.pop(job_id, None)
        self.beat.wake.set()

    async def _one(self, workflow_id: str, progress: JobProgress, state_change: bool) -> None:
        async with self.sem:
            payload = redact_value(progress)
            try:
                if state_change:
                    await _wake_now(self.client, workflow_id, payload)
                else:
                    await self.client.get_workflow_handle(workflow_id).signal(
                        JOB_CHANGED_SIGNAL, payload, rpc_timeout=timedelta(seconds=RPC_DEADLINE_S))
            except RPCError as e:
                if e.status == RPCStatusCode.NOT_FOUND:  # closed target: nobody to tell any more
                    self.engine.told(progress.job_id, progress.model_copy(update={"terminal": True}))
                else:
                    tries = self.retry.get(progress.job_id, (0, 0.0))[0] + 1
                    wait_s = min(WAKE_RETRY_MAX_S, 2.0 ** (tries - 1))
                    self.retry[progress.job_id] = (tries, time.monotonic() + wait_s)
                    activity.logger.warning(f"could not wake {workflow_id} about {progress.job_id} "
                                            f"(try {tries}; again in {wait_s:.0f}s): {e}")
                return
        self.retry.pop(progress.job_id, None)
        self.engine.told(progress.job_id, progress)
        self.engine.on_progress()
        self.beat.signals += 1

    async def close(self) -> None:
        """Cancel what is in flight (the activity ends): not marked as told, so the next attempt sends it again
        (an update's id makes a repeat harmless)."""
        tasks = list(self.inflight.values())
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t


WAKE_UPDATE = "wake"  # TargetBuildWorkflow.wake


async def _wake_now(client: Client, workflow_id: str, progress: JobProgress) -> None:
    """A state change goes to the target as its ``wake`` update, the same handler as ``job_changed``: the
    server runs the update's workflow task speculatively and persists it once together with the step it
    schedules (the log check), where a signal costs two more persisted writes before the target can act
    (issue 37: the target's step after a poll, signal → log check scheduled, p95 4.1 / 7.7 s as signals and
    2.1 / 1.2 s as updates with 50 targets woken at once, interleaved at load 9-12).

    The update id is the job and its state, so a repeated wake-up (a retried round, a restarted watcher) is
    deduplicated by the server. Bounded by RPC_DEADLINE_S (an update waits for the target's worker). When it
    cannot be delivered (a target of the previous release has no ``wake`` handler and rejects it, a server
    without updates, no worker within the bound) the signal is sent as before: it is durable at once and
    harmless beside an update that lands later. A closed target (NOT_FOUND) is the caller's."""
    handle = client.get_workflow_handle(workflow_id)
    try:
        await asyncio.wait_for(handle.execute_update(
            WAKE_UPDATE, progress, id=f"wake:{progress.job_id}:{progress.state}:{int(progress.terminal)}",
            rpc_timeout=timedelta(seconds=RPC_DEADLINE_S)), RPC_DEADLINE_S)
        return
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            raise
        why = e.message
    except (WorkflowUpdateFailedError, WorkflowUpdateRPCTimeoutOrCancelledError, TimeoutError) as e:
        why = type(e).__name__
    activity.logger.info(f"wake update to {workflow_id} not delivered ({why}); signalling instead")
    await handle.signal(JOB_CHANGED_SIGNAL, progress, rpc_timeout=timedelta(seconds=RPC_DEADLINE_S))


HEARTBEAT_FRESH_S = 30.0  # a watcher whose last heartbeat is older than this is presumed stuck or dead


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
    """What the watcher knows of ``job_id`` if the watcher is alive (a fresh heartbeat) and its record of
    what it told the target agrees with the target (state, terminal, missing); None when anything may
    have been lost. The live progress comes from the heartbeat for followed jobs, else the record."""
    view = await watcher_view(client, cluster, task_queue)
    if view is None:
        return None
    try:
        entry = await client.get_workflow_handle(watcher_id(cluster, task_queue)).query(
            "watched_job", job_id, result_type=Optional[WatchRequest])  # noqa: UP045 - a runtime type for the converter
    except RPCError:
        return None
    if entry is None:
        return None
    told = entry.known
    if (told.state, told.terminal, told.missing) != (known.state, known.terminal, known.missing):
        return None
    live = ((view.get("jobs") or {}).get(job_id) or {}).get("now")
    return JobProgress.model_validate(live) if live else told


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
