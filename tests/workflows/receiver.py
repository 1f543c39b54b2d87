"""Shared by tests/workflows/test_watcher_scale.py and bench/watcher_scale.py (a module of its own so the
workflow sandbox re-imports only this small file): a payload size recorder, a target stand-in and a
superseded watcher run."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.api.common.v1 import Payload
from temporalio.common import RetryPolicy
from temporalio.converter import PayloadCodec

with workflow.unsafe.imports_passed_through():
    from domain.models import JobProgress, Stage, TargetBrief, TargetInput, TargetResult
    from domain.watch import (
        PageRequest,
        WatchClusterInput,
        WatchClusterResult,
        WatchJobInput,
        WatchPage,
        WatchRequest,
    )
    from workflows import options


class SizeRecorder(PayloadCodec):
    """Records the size of every payload encoded or decoded (passes them through unchanged)."""

    def __init__(self) -> None:
        self.largest = 0
        self.count = 0

    def _see(self, payloads) -> None:
        for p in payloads:
            self.count += 1
            self.largest = max(self.largest, p.ByteSize())

    async def encode(self, payloads: list[Payload]) -> list[Payload]:
        self._see(payloads)
        return list(payloads)

    async def decode(self, payloads: list[Payload]) -> list[Payload]:
        self._see(payloads)
        return list(payloads)


@workflow.defn
class EndReceiver:
    """Plays a target: waits for the watcher's wake-up (the ``wake`` update on a state change, the
    ``job_changed`` signal for progress) with a terminal state."""

    def __init__(self) -> None:
        self.progress: JobProgress | None = None

    @workflow.signal
    def job_changed(self, progress: JobProgress) -> None:
        self.progress = progress

    @workflow.update
    def wake(self, progress: JobProgress) -> None:
        self.progress = progress

    @workflow.run
    async def run(self) -> JobProgress:
        await workflow.wait_condition(lambda: self.progress is not None and self.progress.terminal)
        return self.progress


@workflow.defn
class SignalOnlyReceiver:
    """Plays a target of the previous release: ``job_changed`` only, no ``wake`` update handler."""

    def __init__(self) -> None:
        self.progress: JobProgress | None = None

    @workflow.signal
    def job_changed(self, progress: JobProgress) -> None:
        self.progress = progress

    @workflow.run
    async def run(self) -> JobProgress:
        await workflow.wait_condition(lambda: self.progress is not None and self.progress.terminal)
        return self.progress


@workflow.defn
class SupersededWatcher:
    """Plays a watcher run that has continued as new while its watch activity was being started: the
    workflow id's current run (whose ``changes`` the activity reads) is another one."""

    @workflow.init
    def __init__(self, cluster: str, watch: WatchRequest) -> None:
        self.watch = watch

    @workflow.query
    def changes(self, req: PageRequest) -> WatchPage:
        return WatchPage(watches=[self.watch] if not req.since else [], next=1, watched=1, run_id="a-newer-run")

    @workflow.run
    async def run(self, cluster: str, watch: WatchRequest) -> WatchClusterResult:
        return await workflow.execute_activity("watch_cluster", WatchClusterInput(cluster=cluster, return_after_s=60),
                                               result_type=WatchClusterResult,
                                               start_to_close_timeout=timedelta(seconds=120),
                                               retry_policy=RetryPolicy(maximum_attempts=1))


@workflow.defn
class Registrant:
    """A target's registration step alone: ``watch_job`` with the production options, then (the registration
    reads nothing: the state is ``unknown``) the watcher's wake-up with the state its poll read, bounded
    (tests/workflows/test_watch_registration.py). Register it under its own workflow id."""

    def __init__(self) -> None:
        self.told: JobProgress | None = None

    @workflow.signal
    def job_changed(self, progress: JobProgress) -> None:
        self.told = progress

    @workflow.run
    async def run(self, inp: WatchJobInput) -> JobProgress:
        known = await workflow.execute_activity("watch_job", inp, result_type=JobProgress, **options.WATCH_JOB)
        if known.state != "unknown":
            return known
        await workflow.wait_condition(lambda: self.told is not None, timeout=timedelta(minutes=3))
        return self.told


@workflow.defn
class BriefRecorder:
    """Plays the pipeline: starts one TargetBuildWorkflow child and records the stages it is told
    (``target_changed``) until ``done`` (tests/workflows/test_target_acts_first.py)."""

    def __init__(self) -> None:
        self.briefs: list[str] = []

    @workflow.signal
    def target_changed(self, brief: TargetBrief) -> None:
        self.briefs.append(brief.stage.value)

    @workflow.run
    async def run(self, inp: TargetInput) -> list[str]:
        await workflow.execute_child_workflow("TargetBuildWorkflow", inp, id=f"{workflow.info().workflow_id}-t",
                                              result_type=TargetResult)
        await workflow.wait_condition(lambda: bool(self.briefs) and self.briefs[-1] == Stage.DONE.value)
        return self.briefs
