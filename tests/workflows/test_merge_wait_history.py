"""A 30-day review wait keeps every run's history bounded: the merge wait continues as new carrying
only MergeWaitState, and the build still ends merged (with its report intact) in the last run.

30 days of an idle PR is 720 watch returns (the real watch long-polls GitHub and returns after an hour
without a change); the stand-in returns each of them at once, unchanged. (The workflow clock cannot be
moved by that hour inside an in-flight activity: the time-skipping server would fire its heartbeat
timeout.) The history per watch return is what a real idle hour costs, so the runs' lengths are the
30-day lengths."""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime

from temporalio import activity
from temporalio.api.enums.v1 import EventType

from domain.models import MergeAuthorization, PipelineInput, PipelineReport, ReviewState, WatchInput
from tests.contract.helpers import COMMIT
from tests.workflows.standins import MERGE_COMMIT, Standins, eventually, request, review, worker
from workflows.pipeline import WATCH_RETURN_S, BuildPipelineWorkflow

DAYS = 30
IDLE_WATCHES = int(DAYS * 24 * 3600 / WATCH_RETURN_S)  # 720
TEMPORAL_WARNING = 10_240


class IdlePullRequest(Standins):
    """GitHub shows the PR unchanged (checks pending) for 30 days of watches, then green."""

    def __init__(self, env, **kw):
        super().__init__(reviews=[review("pending")], **kw)
        self.env = env
        self.idle_watches = 0

    @activity.defn(name="watch_pull_request")
    async def watch_pull_request(self, inp: WatchInput) -> ReviewState:
        self.calls.append(("watch_pull_request", None))  # inputs are not kept: 8,640 of them
        if inp.last is not None and inp.last == self.review_now:
            self.idle_watches += 1
        return self.review_now


async def _runs(env, wid: str, first_run: str) -> list[tuple[str, int, bool, datetime, datetime]]:
    """(run id, history length, continued as new, first and last event time) of every run of the chain,
    following continue-as-new."""
    out, run = [], first_run
    while run:
        history = await env.client.get_workflow_handle(wid, run_id=run).fetch_history()
        last = history.events[-1]
        continued = last.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
        out.append((run, len(history.events), continued, last.event_time.ToDatetime(),
                    history.events[0].event_time.ToDatetime()))
        run = last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id if continued else None
    return out


async def test_a_30_day_review_wait_stays_under_the_history_warning_in_every_run(own_time_skipping_env):
    env = own_time_skipping_env
    u = uuid.uuid4().hex[:8]
    wid, tq = f"merge-wait-30d-{u}", f"tq-{u}"
    s = IdlePullRequest(env)
    async with worker(env.client, tq, s):
        handle = await env.client.start_workflow(
            BuildPipelineWorkflow.run, PipelineInput(request=request(), request_id=wid, source_commit=COMMIT),
            id=wid, task_queue=tq)
        first_run = handle.result_run_id

        async def thirty_days_idle():
            return s.idle_watches >= IDLE_WATCHES
        await eventually(thirty_days_idle, what="30 days of idle watches", attempts=20_000, interval=0.05)
        # After 30 days a maintainer merges the PR on GitHub: the current run sees it and ends merged.
        s.set_review(review("success").model_copy(update={"merged": True, "merge_commit": MERGE_COMMIT}))
        rep: PipelineReport = await asyncio.wait_for(
            env.client.get_workflow_handle(wid, result_type=PipelineReport).result(), 60)

    assert rep.status == "merged" and rep.merge_commit == MERGE_COMMIT
    assert [t.status for t in rep.targets] == ["validated"] and rep.pull_request.number == 7  # carried intact
    runs = await _runs(env, wid, first_run)
    lengths = [r[1] for r in runs]
    assert len(runs) >= 2 and all(r[2] for r in runs[:-1]) and not runs[-1][2]
    assert max(lengths) < TEMPORAL_WARNING, lengths
    assert sum(lengths) > 5 * IDLE_WATCHES  # without continue-as-new one run would hold all of these
    assert len(s.names("record_artifact")) == 1 and s.names("merge_pull_request") == []
    assert len(s.names("submit_job")) == 1  # the build ran once; later runs only waited


async def test_an_authorization_given_while_pending_holds_across_continue_as_new(own_time_skipping_env):
    """The operator approves once while CI is pending; the wait continues as new several times (short
    runs here); the check turns green in a later run and it merges on that same, verified authorization."""
    env = own_time_skipping_env
    u = uuid.uuid4().hex[:8]
    wid, tq = f"merge-wait-auth-{u}", f"tq-{u}"
    s = Standins(reviews=[review("pending")])
    async with worker(env.client, tq, s):
        handle = await env.client.start_workflow(
            BuildPipelineWorkflow.run, PipelineInput(request=request(), request_id=wid, source_commit=COMMIT,
                                                     merge_wait_events_per_run=120), id=wid, task_queue=tq)
        first_run = handle.result_run_id

        async def awaiting():
            return (await handle.query(BuildPipelineWorkflow.report)).review is not None
        await eventually(awaiting, what="awaiting merge")
        ack = await handle.execute_update(BuildPipelineWorkflow.approve_merge, MergeAuthorization(by="ana"))
        assert "accepted and queued" in ack

        async def continued_twice():
            return len(await _runs(env, wid, first_run)) >= 3
        await eventually(continued_twice, what="two continue-as-new while pending", attempts=2000)
        assert s.names("merge_pull_request") == []
        s.set_review(review("success"))
        rep: PipelineReport = await asyncio.wait_for(
            env.client.get_workflow_handle(wid, result_type=PipelineReport).result(), 60)

    assert rep.status == "merged" and "authorized by ana, config:operators.logins" in rep.message
    merges = s.names("merge_pull_request")
    assert len(merges) == 1 and merges[0].authorization.by == "ana"
    assert merges[0].authorization.temporal_identity == env.client.identity
    assert len(s.names("authorize_operator")) == 1  # verified once, carried in MergeWaitState
    runs = await _runs(env, wid, first_run)
    assert len(runs) >= 3 and all(r[2] for r in runs[:-1])
