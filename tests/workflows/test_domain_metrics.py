"""Domain metrics leave through the SDK's metric pipeline: stages entered, failures by class and operator
wait time, read back from a MetricBuffer on a real dev server (the runtime a `--metrics` worker uses)."""

from __future__ import annotations

import uuid

import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import MetricBuffer, Runtime, TelemetryConfig

from domain.models import Stage
from tests.workflows.standins import (
    MANIFEST_MISMATCH,
    Round,
    Standins,
    eventually,
    result,
    target_input,
    worker,
)
from workflows import metrics
from workflows.target import TargetBuildWorkflow


def _points(updates, name: str) -> list[tuple[dict, float]]:
    return [(dict(u.attributes), u.value) for u in updates if u.metric.name == name]


async def test_a_failed_target_counts_its_stages_and_its_failure_class_once(temporal_dev_server):
    buffer = MetricBuffer(10_000)
    runtime = Runtime(telemetry=TelemetryConfig(metrics=buffer))
    client = await Client.connect(temporal_dev_server.address, namespace=temporal_dev_server.namespace,
                                  data_converter=pydantic_data_converter, runtime=runtime)
    wid, tq = f"wf-metrics-{uuid.uuid4().hex[:8]}", f"tq-metrics-{uuid.uuid4().hex[:8]}"
    s = Standins(rounds={"amd64-standard": [Round(state="failed", evidence=MANIFEST_MISMATCH)]})
    async with worker(client, tq, s):
        handle = await client.start_workflow(TargetBuildWorkflow.run, target_input(wid), id=wid, task_queue=tq)
        with pytest.raises(WorkflowFailureError):
            await result(handle)
    updates = buffer.retrieve_updates()
    stages = [attrs["stage"] for attrs, _ in _points(updates, metrics.STAGE_ENTERED) if attrs["workflow"] == "target"]
    assert stages[0] == "submitting" and stages[-1] == "failed" and "capturing" in stages
    failures = _points(updates, metrics.FAILURES)
    assert [(a["failure_class"], v) for a, v in failures] == [("input_error", 1)]
    assert all(a.get("workflow_type") in (None, "TargetBuildWorkflow") for a, _ in failures)


async def test_a_visibility_wait_records_operator_time_and_no_failure(temporal_dev_server):
    buffer = MetricBuffer(10_000)
    client = await Client.connect(temporal_dev_server.address, namespace=temporal_dev_server.namespace,
                                  data_converter=pydantic_data_converter,
                                  runtime=Runtime(telemetry=TelemetryConfig(metrics=buffer)))
    wid, tq = f"wf-metrics-{uuid.uuid4().hex[:8]}", f"tq-metrics-{uuid.uuid4().hex[:8]}"
    s = Standins(validations={"amd64-standard": ["blocked", "pass"]})
    async with worker(client, tq, s):
        handle = await client.start_workflow(TargetBuildWorkflow.run, target_input(wid), id=wid, task_queue=tq)
        await eventually(lambda: _waiting(handle), what="the visibility wait")
        await handle.signal(TargetBuildWorkflow.recheck)
        assert (await result(handle)).status == "validated"
    updates = buffer.retrieve_updates()
    waits = _points(updates, metrics.OPERATOR_WAIT)
    assert [a["reason"] for a, _ in waits] == ["visibility"] and waits[0][1] >= 0
    assert _points(updates, metrics.FAILURES) == []


async def _waiting(handle) -> bool:
    return (await handle.query(TargetBuildWorkflow.status)).stage == Stage.WAITING
