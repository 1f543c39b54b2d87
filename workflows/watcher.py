"""One watcher workflow per Iris cluster (id ``iris-watcher/<cluster>``): who watches which job.

Targets register through ``watch_job`` (signal-with-start, so the first target of a cluster starts it);
the ``watch_cluster`` activity reads the watch set through the ``watched`` query every interval, polls
the controller once for all jobs and signals the targets whose job changed; it unwatches a job once
its target has been told the terminal state. The workflow ends when nothing is left to watch and
continues-as-new (carrying only the watch set) before its history grows large.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities.watch import WatchActivities
    from domain.watch import FollowRequest, WatchClusterInput, WatcherInput, WatchRequest, WatchSet
    from workflows import options

WATCH_RETURN_S = 3600.0
MAX_EVENTS_PER_RUN = 2000  # continue-as-new well before Temporal's 10,240-event warning


@workflow.defn
class IrisWatcherWorkflow:
    @workflow.init
    def __init__(self, inp: WatcherInput) -> None:
        self._watches: dict[str, WatchRequest] = {w.job_id: w for w in inp.watches}
        self._following: dict[str, float] = dict(inp.following)

    @workflow.signal
    def watch(self, req: WatchRequest) -> None:
        self._watches[req.job_id] = req

    @workflow.signal
    def unwatch(self, job_ids: list[str]) -> None:
        for job_id in job_ids:
            self._watches.pop(job_id, None)
            self._following.pop(job_id, None)

    @workflow.signal
    def follow(self, req: FollowRequest) -> None:
        for job_id in req.job_ids:
            self._following[job_id] = req.until_s

    @workflow.query
    def watched(self) -> WatchSet:
        return WatchSet(watches=list(self._watches.values()), following=self._following)

    @workflow.run
    async def run(self, inp: WatcherInput) -> None:
        while self._watches:
            await workflow.execute_activity_method(
                WatchActivities.watch_cluster, WatchClusterInput(cluster=inp.cluster, return_after_s=WATCH_RETURN_S),
                **options.watch_cluster(WATCH_RETURN_S),
                summary=f"poll Iris on {inp.cluster} for {len(self._watches)} job(s), wake targets on change")
            now = workflow.now().timestamp()
            self._following = {j: t for j, t in self._following.items() if t > now and j in self._watches}
            info = workflow.info()
            if self._watches and (info.is_continue_as_new_suggested()
                                  or info.get_current_history_length() > MAX_EVENTS_PER_RUN):
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(WatcherInput(cluster=inp.cluster, watches=list(self._watches.values()),
                                                      following=self._following))
