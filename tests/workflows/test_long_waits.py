"""Weeks-long waits stay bounded in every run's history, under the time-skipping server (moving time).

Four targets wait 30 days — for their packages to become public, or for an operator's decision —
and the build then finishes. Each target continues as new once a run's history (or age) is long, so
every run of every target, and the pipeline's single run, stays far under Temporal's 10,240-event
warning; a re-check that changes nothing tells the pipeline nothing (at most one signal per re-check).
The events per day printed here are the figures in docs/benchmarks.md."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowUpdateStage

from domain.config import PolicySettings
from domain.models import OperatorDecision, PipelineInput, PipelineReport, ValidateInput, target_workflow_id
from domain.validation import ValidationReport
from tests.contract.helpers import COMMIT
from tests.workflows.standins import (
    MERGE_COMMIT,
    UNKNOWN,
    Round,
    Standins,
    eventually,
    request,
    review,
    validation,
    worker,
)
from tests.workflows.test_merge_wait_history import _runs
from workflows.pipeline import BuildPipelineWorkflow
from workflows.target import TargetBuildWorkflow

DAYS = 30
TEMPORAL_WARNING = 10_240
FOUR = request(archs=("amd64", "arm64"), variants=("standard", "megatron"))
MERGED = review("success").model_copy(update={"merged": True, "merge_commit": MERGE_COMMIT})


class PrivateForDays(Standins):
    """Every package stays private for ``days`` of workflow time after its first validation, then is public."""

    def __init__(self, days: float, **kw):
        super().__init__(reviews=[MERGED], **kw)
        self.days = days
        self.first: dict[str, float] = {}
        self.validations = 0

    @activity.defn(name="validate_image")
    async def validate_image(self, inp: ValidateInput) -> ValidationReport:
        self.validations += 1  # inputs are not kept: thousands of them
        now = activity.info().current_attempt_scheduled_time.timestamp()
        first = self.first.setdefault(inp.target.key, now)
        return validation(inp.target, "blocked" if now - first < self.days * 86400 else "pass")


async def _chains(env, wid: str, keys: list[str]) -> dict[str, list[tuple]]:
    """Every run of each target's continue-as-new chain (see test_merge_wait_history._runs)."""
    return {key: await _runs(env, target_workflow_id(wid, key), await _first_run(env, wid, key)) for key in keys}


async def _first_run(env, wid: str, key: str) -> str:
    """The first run of a target: the one its parent started (from the pipeline's history)."""
    history = await env.client.get_workflow_handle(wid).fetch_history()
    for e in history.events:
        if e.event_type == EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED:
            a = e.child_workflow_execution_started_event_attributes
            if a.workflow_execution.workflow_id == target_workflow_id(wid, key):
                return a.workflow_execution.run_id
    raise AssertionError(f"no child started for {key}")


async def _result(env, wid: str) -> PipelineReport:
    """The pipeline's result; time skips while it is awaited. The test server's history long-poll can end
    before a weeks-long run does ("No completion event found"): then await it again."""
    while True:
        try:
            return await env.client.get_workflow_handle(wid, result_type=PipelineReport).result()
        except RuntimeError as e:
            if "No completion event" not in str(e):
                raise


def _signals(history) -> int:
    return sum(1 for e in history.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED)


@pytest.mark.timeout(900)
async def test_a_30_day_visibility_wait_of_4_targets_stays_under_the_warning_in_every_run(own_time_skipping_env):
    env = own_time_skipping_env
    u = uuid.uuid4().hex[:8]
    wid, tq = f"visibility-30d-{u}", f"tq-{u}"
    # Re-checks every 4 h (production: every 600 s) keep the test to 720 validations; a re-check costs the
    # same events at any interval, so the production rate is printed from the measured cost per re-check.
    policy = PolicySettings(visibility_recheck_interval_s=14400)
    s = PrivateForDays(DAYS, policy=policy)
    async with worker(env.client, tq, s):
        handle = await env.client.start_workflow(
            BuildPipelineWorkflow.run, PipelineInput(request=FOUR, request_id=wid, source_commit=COMMIT),
            id=wid, task_queue=tq)
        for _ in range(DAYS + 1):  # move the clock a day at a time: every re-check timer on the way fires
            await env.sleep(timedelta(days=1))
        rep = await asyncio.wait_for(_result(env, wid), 300)
        pipeline = await handle.fetch_history()
        keys = [t.key for t in rep.targets]
        chains = await _chains(env, wid, keys)

    assert rep.status == "merged" and len(keys) == 4 and all(t.status == "validated" for t in rep.targets)
    rechecks = DAYS * 86400 / policy.visibility_recheck_interval_s
    assert s.validations >= 4 * rechecks  # 30 days of re-checks really ran
    for key, runs in chains.items():
        lengths = [r[1] for r in runs]
        assert len(runs) >= 2 and all(r[2] for r in runs[:-1]) and not runs[-1][2], (key, lengths)
        assert max(lengths) < TEMPORAL_WARNING, (key, lengths)
    # The pipeline heard of each target's wait once, not once per re-check (it would be 4 x 4,320 x 2).
    assert len(pipeline.events) < TEMPORAL_WARNING and _signals(pipeline) < 4 * 10, _signals(pipeline)
    assert len(s.names("submit_job")) == 4  # one job per target: nothing was rebuilt
    per_target = sum(r[1] for r in chains[keys[0]])
    per_recheck = per_target / rechecks
    print(f"\nvisibility wait, 4 targets, re-check every {policy.visibility_recheck_interval_s} s: "
          f"{per_target / DAYS:.0f} events/day per target ({per_recheck:.1f} per re-check: "
          f"{per_recheck * 86400 / PolicySettings().visibility_recheck_interval_s:.0f}/day at the production "
          f"600 s; runs {[r[1] for r in chains[keys[0]]]}), pipeline {len(pipeline.events) / DAYS:.1f} events/day "
          f"({len(pipeline.events)} in one run, {_signals(pipeline)} signals)")


# Cause found (session 15, reproduced 1 in 22 runs alone, and in the clean-clone suite at ec209c7): the Java
# time-skipping test server sometimes refuses the workflow task that follows a ``decide`` update's activity
# ("Error while completing workflow activation: invalid history builder state for action"), recording nothing. A
# real server would time the task out and hand it out again; the test server counts that timeout in skipped time,
# which stands still while the client waits in ``execute_update`` (time skips only while a workflow result is
# awaited): the test waited forever. So the decisions are sent up to their acceptance (the validator ran) and the
# test then awaits the pipeline's result, during which time skips, a refused task times out and is retried, and
# each update's own result is checked after. Not yet seen recovering (0 refusals in 64 runs after the change), so
# the test is still retried once, visibly, until a run shows the refused task handed out again.
@pytest.mark.flaky(reruns=1)
@pytest.mark.timeout(120)
async def test_a_30_day_decision_wait_of_4_targets_continues_as_new_and_takes_the_decision(own_time_skipping_env):
    env = own_time_skipping_env
    u = uuid.uuid4().hex[:8]
    wid, tq = f"decision-30d-{u}", f"tq-{u}"
    policy = PolicySettings(operator_decision_timeout_s=(DAYS + 5) * 86400)
    rounds = [Round(state="failed", evidence=UNKNOWN), Round()]  # unknown failure → ask; the retry builds
    s = Standins(rounds={k: rounds for k in ("amd64-standard", "amd64-megatron", "arm64-standard",
                                             "arm64-megatron")}, reviews=[MERGED], policy=policy)
    async with worker(env.client, tq, s):
        handle = await env.client.start_workflow(
            BuildPipelineWorkflow.run, PipelineInput(request=FOUR, request_id=wid, source_commit=COMMIT),
            id=wid, task_queue=tq)

        async def all_waiting():
            rep = await handle.query(BuildPipelineWorkflow.report)
            return len([w for w in rep.waiting if w.kind == "operator_decision"]) == 4 and rep
        rep = await eventually(all_waiting, what="4 targets waiting for a decision", attempts=2000)
        await env.sleep(timedelta(days=DAYS))  # 30 days without an answer
        updates = [await env.client.get_workflow_handle(target_workflow_id(wid, t.key)).start_update(
            TargetBuildWorkflow.decide, OperatorDecision(action="retry", by="tester"),
            wait_for_stage=WorkflowUpdateStage.ACCEPTED) for t in rep.plan]
        final: PipelineReport = await asyncio.wait_for(
            env.client.get_workflow_handle(wid, result_type=PipelineReport).result(), 100)
        accepted = [await asyncio.wait_for(u.result(), 10) for u in updates]
        pipeline = await handle.fetch_history()
        chains = await _chains(env, wid, [t.key for t in final.targets])

    assert all(a.startswith("retry accepted for ") for a in accepted), accepted
    assert final.status == "merged" and all(t.status == "validated" for t in final.targets)
    assert all(len(t.job_ids) == 2 and [f.decision for f in t.failures] == ["retry"] for t in final.targets)
    for key, runs in chains.items():
        lengths = [r[1] for r in runs]
        # a run lasts at most WAIT_RUN_MAX_S (7 days): 30 days are at least 5 runs, each short
        assert len(runs) >= 5 and all(r[2] for r in runs[:-1]), (key, lengths)
        assert max(lengths) < TEMPORAL_WARNING, (key, lengths)
    assert len(pipeline.events) < TEMPORAL_WARNING
    print(f"\ndecision wait, 4 targets: {sum(r[1] for r in next(iter(chains.values()))) / DAYS:.1f} events/day per "
          f"target, pipeline {len(pipeline.events) / DAYS:.1f} events/day")
