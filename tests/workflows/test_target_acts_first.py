"""A target that is a pipeline's child acts on its job's end in the same workflow task as the pipeline's signal
(issue 37, end -> act; patch ACT_BEFORE_TELLING): before, ``_set_stage(VALIDATING)`` awaited the signal to the
pipeline, so the log check was scheduled one workflow task later, after the signal's round trip. Briefs still
reach the pipeline in order and the last one before the target ends.

Real TargetBuildWorkflow as the child of a minimal parent that records every brief, stand-in activities, the
Temporal dev server."""

from __future__ import annotations

import uuid

from temporalio.api.enums.v1 import EventType
from temporalio.worker import Worker

from tests.workflows.receiver import BriefRecorder
from tests.workflows.standins import Standins, result, target_input
from workflows.target import TargetBuildWorkflow


async def test_a_child_target_schedules_its_log_check_in_the_task_that_tells_the_pipeline(temporal_client):
    run = uuid.uuid4().hex[:8]
    tq, wid = f"tq-acts-{run}", f"acts-{run}"
    s = Standins()
    async with Worker(temporal_client, task_queue=tq, workflows=[BriefRecorder, TargetBuildWorkflow],
                      activities=s.all()):
        briefs = await result(await temporal_client.start_workflow(BriefRecorder.run, target_input(wid), id=wid,
                                                                   task_queue=tq))
    events = [e async for e in temporal_client.get_workflow_handle(f"{wid}-t").fetch_history_events()]
    # The workflow task that scheduled check_build_log also sent the pipeline its VALIDATING brief.
    check = next(e for e in events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
                 and e.activity_task_scheduled_event_attributes.activity_type.name == "check_build_log")
    task = check.activity_task_scheduled_event_attributes.workflow_task_completed_event_id
    signals = [e for e in events
               if e.event_type == EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED]
    told_in_task = [e for e in signals
                    if e.signal_external_workflow_execution_initiated_event_attributes.workflow_task_completed_event_id
                    == task]
    assert len(told_in_task) == 1, [(e.event_id, task) for e in signals]
    # Every brief arrived, in order, the last one (done) before the target ended.
    assert briefs == ["submitting", "running", "validating", "done"], briefs


async def test_acting_before_telling_the_pipeline_is_safe_only_because_it_is_patched(temporal_client, tmp_path,
                                                                                      monkeypatch):
    """docs/versioning.md's rule for this change: a child target recorded by the code before it (the brief's
    signal awaited, the log check one task later; here: a copy with the guard off) replays clean on the current
    code, and fails replay on a copy with the guard removed (the new order unconditionally)."""
    from temporalio.contrib.pydantic import pydantic_data_converter
    from temporalio.worker import Replayer

    from tests.workflows.test_replay import _load_copy

    guard = "workflow.patched(patches.ACT_BEFORE_TELLING)"
    before = _load_copy(tmp_path, monkeypatch, "target_copy_act_before", (guard, "False"))
    unguarded = _load_copy(tmp_path, monkeypatch, "target_copy_act_unguarded", (guard, "True"))
    run = uuid.uuid4().hex[:8]
    tq, wid = f"tq-acts-old-{run}", f"acts-old-{run}"
    s = Standins()
    async with Worker(temporal_client, task_queue=tq, workflows=[BriefRecorder, before], activities=s.all()):
        await result(await temporal_client.start_workflow(BriefRecorder.run, target_input(wid), id=wid, task_queue=tq))
    history = await temporal_client.get_workflow_handle(f"{wid}-t").fetch_history()
    ok = await Replayer(workflows=[TargetBuildWorkflow], data_converter=pydantic_data_converter).replay_workflow(
        history, raise_on_replay_failure=False)
    assert ok.replay_failure is None, ok.replay_failure
    bad = await Replayer(workflows=[unguarded], data_converter=pydantic_data_converter).replay_workflow(
        history, raise_on_replay_failure=False)
    assert bad.replay_failure is not None and "nondetermin" in repr(bad.replay_failure).lower(), bad.replay_failure
