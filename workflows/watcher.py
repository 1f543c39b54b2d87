"""One watcher workflow per Iris cluster (id ``iris-watcher/<task queue>/<cluster>``): who watches which job.

Targets register through ``watch_job`` (signal-with-start, so the first target of a cluster starts it);
the ``watch_cluster`` activity holds the working state (what each target was told, log cursors) in
memory, reads the watch set once in pages at start and then only what changed (``changes`` query by
revision), polls the controller once for all jobs and signals the targets whose job changed. What it told
a target comes back here (``told``, batched), so a restarted activity rebuilds its state from this
workflow alone; a job whose target was told the terminal state is dropped.

Bounded payloads at any job count: markers are held once per build contract (``marker_set``) and reach a
run once per contract (inline in the first registration of their key, or a ``markers`` signal; every
other registration names the key only, so a burst of registrations costs each activation little), query
replies are pages of at most ``PAGE_BUDGET_BYTES``, ``told`` batches are cut at ``TOLD_BATCH`` jobs,
and the continue-as-new input carries only the previous run's id: the new run's activity adopts that
closed run's watch set page by page (``adopt`` signals) before it polls. Each run continues as new as soon
as its history passes ``events_per_run`` (the watch activity is cancelled then), so a run replays fast
whatever the registration rate. Runs started before this change (patch ``WATCHER_BOUNDED``) wait for
their activity and continue as new the old way, carrying their watch set.
"""

from __future__ import annotations

import asyncio
import contextlib

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.watch import WatchActivities
    from domain.models import JobProgress
    from domain.watch import (
        AdoptChunk,
        FollowRequest,
        MarkerSet,
        PageRequest,
        WatchClusterInput,
        WatcherInput,
        WatchPage,
        WatchRequest,
        WatchSet,
        marker_set_key,
    )
    from workflows import options, patches

WATCH_RETURN_S = 3600.0
MAX_EVENTS_PER_RUN = 2000  # continue-as-new well before Temporal's 10,240-event warning
ENTRY_OVERHEAD_BYTES = 64  # JSON punctuation around an entry in a page
ENTRY_FIXED_BYTES = 600  # field names and numbers of a WatchRequest with its JobProgress (~420 measured) + margin


def _entry_bytes(w: WatchRequest) -> int:
    """An upper bound of one entry's JSON size without serializing it (a page of hundreds of entries is
    cut on every poll's query: serializing each would make the query slow under load)."""
    k = w.known
    return (ENTRY_FIXED_BYTES + len(w.job_id) * 2 + len(w.workflow_id) + len(w.registered_at) + len(w.marker_set)
            + len(k.error or "") + len(k.pending_reason or "") + len(k.last_marker or "") + len(k.state))


@workflow.defn
class IrisWatcherWorkflow:
    @workflow.init
    def __init__(self, inp: WatcherInput) -> None:
        self._watches: dict[str, WatchRequest] = {}
        self._markers: dict[str, list[str]] = {}
        # Revision at which a marker set became known through a ``markers`` signal (after registrations that
        # named its key): ``changes`` after an older revision carry it, so the activity learns it once.
        self._marker_revs: dict[str, int] = {}
        self._following: dict[str, float] = dict(inp.following)
        # Revision of each job's last change (registration, follow, removal), in revision order: the
        # activity reads ``changes`` after the revision it has, so a poll reads only what changed.
        self._revs: dict[str, int] = {}
        self._rev = 0
        self._adopting = inp.previous_run_id
        self._events_per_run = inp.events_per_run or MAX_EVENTS_PER_RUN
        self._due = False  # the history is long enough to continue as new (set by the signal handlers)
        for w in inp.watches:
            self._store(w)

    # ------------------------------------------------------------------ state
    def _bump(self, job_id: str) -> None:
        self._rev += 1
        self._revs.pop(job_id, None)
        self._revs[job_id] = self._rev  # re-inserted: the dict stays in revision order

    def _store(self, req: WatchRequest) -> None:
        """O(1) and cheap per registration (hundreds may arrive in one activation): the request is a fresh
        object of this workflow (a signal, input or adopted page), so it is kept as it is, without a copy;
        a key is hashed only for a registration of the previous release (texts, no key)."""
        if req.markers:
            key = req.marker_set or marker_set_key(req.markers)
            if key not in self._markers:
                self._markers[key] = req.markers
            req.markers = []
            req.marker_set = key
        self._watches[req.job_id] = req
        self._bump(req.job_id)

    def _drop(self, job_id: str) -> None:
        if self._watches.pop(job_id, None) is not None:
            self._following.pop(job_id, None)
            self._bump(job_id)

    # ------------------------------------------------------------------ signals
    @workflow.signal
    def watch(self, req: WatchRequest) -> None:
        self._store(req)
        self._check_due()

    @workflow.signal
    def watch_many(self, reqs: list[WatchRequest]) -> None:
        """Registrations batched by a worker (``activities/watch.py`` ``_Registrations``): one signal for
        every registration that arrived while the previous one was in flight."""
        for req in reqs:
            self._store(req)
        self._check_due()

    @workflow.signal
    def markers(self, ms: MarkerSet) -> None:
        """A build contract's marker texts for registrations that named the key only (``watch_job`` sends
        this once per contract to a run it did not give the texts inline)."""
        if ms.key and ms.markers and ms.key not in self._markers:
            self._markers[ms.key] = ms.markers
            self._rev += 1
            self._marker_revs[ms.key] = self._rev
        self._check_due()

    @workflow.signal
    def unwatch(self, job_ids: list[str]) -> None:
        for job_id in job_ids:
            self._drop(job_id)
        self._check_due()

    @workflow.signal
    def told(self, progress: list[JobProgress]) -> None:
        """What the watcher told targets (a batch): a restarted activity starts from it; a terminal state
        ends the watch."""
        for p in progress:
            w = self._watches.get(p.job_id)
            if w is None:
                continue
            if p.terminal:
                self._drop(p.job_id)
            else:
                w.known = p
        self._check_due()

    @workflow.signal
    def follow(self, req: FollowRequest) -> None:
        for job_id in req.job_ids:
            self._following[job_id] = req.until_s
            if job_id in self._watches:
                self._bump(job_id)
        self._check_due()

    @workflow.signal
    def adopt(self, chunk: AdoptChunk) -> None:
        """A page of the previous run's watch set. A job registered or dropped in this run already is
        newer than the previous run's record of it and is kept as it is."""
        if chunk.from_run_id != self._adopting:
            return
        self._markers.update({k: v for k, v in chunk.marker_sets.items() if k not in self._markers})
        for w in chunk.watches:
            if w.job_id not in self._revs:
                self._store(w)
                if w.job_id in chunk.following:
                    self._following.setdefault(w.job_id, chunk.following[w.job_id])
        if chunk.done:
            self._adopting = None
        self._check_due()

    # ------------------------------------------------------------------ queries (bounded replies)
    @workflow.query
    def changes(self, req: PageRequest) -> WatchPage:
        """The entries changed after revision ``req.since``, in revision order, cut at ``budget_bytes``."""
        page = WatchPage(next=req.since, watched=len(self._watches), adopting=self._adopting,
                         continue_suggested=self._continue_due(), run_id=workflow.info().run_id)
        used = taken = 0
        if req.since:  # marker sets that arrived after registrations naming them (few: one per contract)
            for key, rev in self._marker_revs.items():
                if rev > req.since:
                    page.marker_sets[key] = list(self._markers[key])
                    used += sum(len(m) + 4 for m in self._markers[key])
        for job_id, rev in self._revs.items():
            if rev <= req.since:
                continue
            w = self._watches.get(job_id)
            size = len(job_id) + ENTRY_OVERHEAD_BYTES if w is None else _entry_bytes(w)
            if w is not None and w.marker_set in self._markers and w.marker_set not in page.marker_sets:
                size += sum(len(m) + 4 for m in self._markers[w.marker_set])
            if taken and used + size > req.budget_bytes:
                page.more = True
                break
            used += size
            taken += 1
            page.next = rev
            if w is None:
                if req.since:  # a full read (since 0) needs no tombstones
                    page.removed.append(job_id)
                continue
            page.watches.append(w)
            if w.marker_set in self._markers and w.marker_set not in page.marker_sets:
                page.marker_sets[w.marker_set] = list(self._markers[w.marker_set])
            if job_id in self._following:
                page.following[job_id] = self._following[job_id]
        if not page.more:
            page.next = max(page.next, self._rev)  # everything up to now is in the page (marker sets too)
        return page

    @workflow.query
    def watched_job(self, job_id: str) -> WatchRequest | None:
        """One job's entry (``known`` = what its target was last told), for a target's safety re-check."""
        return self._watches.get(job_id)

    @workflow.query
    def watched(self) -> WatchSet:
        """The previous release's whole-set query, now bounded: the first page only (markers resolved)."""
        page = self.changes(PageRequest())
        return WatchSet(watches=[w.model_copy(update={"markers": page.marker_sets.get(w.marker_set, [])})
                                 for w in page.watches], following=page.following)

    def _check_due(self) -> None:
        """Once per signal (cheap): a wait condition evaluated on every event-loop turn must not call into
        the workflow info (hundreds of signals in one activation would make that quadratic)."""
        self._due = self._due or self._continue_due()

    def _continue_due(self) -> bool:
        info = workflow.info()
        return info.is_continue_as_new_suggested() or info.get_current_history_length() > self._events_per_run

    # ------------------------------------------------------------------ the run
    @workflow.run
    async def run(self, inp: WatcherInput) -> None:
        bounded = workflow.patched(patches.WATCHER_BOUNDED)
        while self._watches or self._adopting:
            options_ = dict(**options.watch_cluster(WATCH_RETURN_S),
                            summary=f"poll Iris on {inp.cluster} for {len(self._watches)} job(s), wake targets on change")
            watch_input = WatchClusterInput(cluster=inp.cluster, return_after_s=WATCH_RETURN_S)
            if bounded:
                # The history is kept short whatever the registration rate: once it is long the watch
                # activity is cancelled and the run continues as new at once (a run that grew to thousands of
                # events would take longer to replay than a workflow task may run).
                act = workflow.start_activity_method(WatchActivities.watch_cluster, watch_input, **options_)
                await workflow.wait_condition(lambda act=act: act.done() or (self._due and not self._adopting))
                if not act.done():
                    act.cancel()
                with contextlib.suppress(ActivityError, asyncio.CancelledError):
                    await act
            else:
                await workflow.execute_activity_method(WatchActivities.watch_cluster, watch_input, **options_)
            now = workflow.now().timestamp()
            self._following = {j: t for j, t in self._following.items() if t > now and j in self._watches}
            if (self._watches or self._adopting) and self._continue_due():
                await workflow.wait_condition(workflow.all_handlers_finished)
                if bounded:
                    if self._adopting:
                        continue  # hand over only an adopted set: the chain of previous runs stays one long
                    workflow.continue_as_new(WatcherInput(cluster=inp.cluster, previous_run_id=workflow.info().run_id,
                                                          events_per_run=self._events_per_run))
                markers = self._markers
                workflow.continue_as_new(WatcherInput(
                    cluster=inp.cluster, following=self._following,
                    watches=[w.model_copy(update={"markers": markers.get(w.marker_set, [])})
                             for w in self._watches.values()]))
