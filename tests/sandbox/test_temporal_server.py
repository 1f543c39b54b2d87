"""The dev-server launcher and the Temporal fixtures, exercised against the real binaries."""

from __future__ import annotations

import asyncio
import os
import uuid
from datetime import timedelta

import pytest
from temporalio import workflow
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

import sandbox.temporal_server as ts
from sandbox.ports import listening_ports
from sandbox.temporal_server import SEARCH_ATTRIBUTES, TemporalServerError, start_temporal_dev_server

BUILD_STAGE = SearchAttributeKey.for_keyword("BuildStage")


@workflow.defn
class StageWorkflow:
    """Sleeps, then marks itself done in a search attribute."""

    @workflow.run
    async def run(self, sleep_s: float) -> str:
        await workflow.sleep(timedelta(seconds=sleep_s))
        workflow.upsert_search_attributes([BUILD_STAGE.value_set("done")])
        return "slept"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_dev_server_registers_project_search_attributes(temporal_client: Client):
    resp = await temporal_client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=temporal_client.namespace)
    )
    assert set(SEARCH_ATTRIBUTES) <= set(resp.custom_attributes)


async def test_dev_server_runs_workflow_and_visibility_query(temporal_client: Client):
    queue = f"tq-{uuid.uuid4()}"
    wid = f"stage-{uuid.uuid4()}"
    async with Worker(temporal_client, task_queue=queue, workflows=[StageWorkflow]):
        handle = await temporal_client.start_workflow(
            StageWorkflow.run, 0.1, id=wid, task_queue=queue,
            search_attributes=TypedSearchAttributes([SearchAttributePair(BUILD_STAGE, "queued")]),
        )
        assert await asyncio.wait_for(handle.result(), 30) == "slept"
    for _ in range(50):  # visibility is eventually consistent
        ids = [w.id async for w in temporal_client.list_workflows(f"BuildStage = 'done' AND WorkflowId = '{wid}'")]
        if ids:
            break
        await asyncio.sleep(0.1)
    assert ids == [wid]


async def test_time_skipping_env_skips_days_with_search_attributes(time_skipping_env):
    queue = f"tq-{uuid.uuid4()}"
    async with Worker(time_skipping_env.client, task_queue=queue, workflows=[StageWorkflow]):
        result = await asyncio.wait_for(
            time_skipping_env.client.execute_workflow(
                StageWorkflow.run, 3 * 24 * 3600.0, id=f"skip-{uuid.uuid4()}", task_queue=queue
            ),
            30,
        )
    assert result == "slept"


async def test_server_persists_across_restart_and_stop_leaves_no_process(tmp_path):
    server = start_temporal_dev_server(tmp_path, ui=True)
    port = int(server.address.rsplit(":", 1)[1])
    client = await Client.connect(server.address, data_converter=pydantic_data_converter)
    wid = f"persist-{uuid.uuid4()}"
    await client.start_workflow(StageWorkflow.run, 1.0, id=wid, task_queue="nobody-polls")
    pid = server.pid
    server.stop()
    server.stop()  # idempotent
    assert not _pid_alive(pid)

    again = start_temporal_dev_server(tmp_path, ui=False, port=port)
    try:
        client = await Client.connect(again.address, data_converter=pydantic_data_converter)
        desc = await client.get_workflow_handle(wid).describe()
        assert desc.id == wid
    finally:
        again.stop()
    assert not _pid_alive(again.pid)


def test_a_port_another_dev_server_answers_on_is_a_failed_start_not_a_ready_server(temporal_dev_server, tmp_path,
                                                                                      monkeypatch):
    """A port taken between choosing and binding (two xdist workers start their servers at once): the other
    server answers ``cluster health`` SERVING on it while this one fails to bind. It was handed out (within
    0.4 s, the session then used the other worker's server); now only this process listening counts."""
    taken = int(temporal_dev_server.address.rsplit(":", 1)[1])
    with pytest.raises(TemporalServerError, match="address already in use"):
        start_temporal_dev_server(tmp_path / "pinned", ui=False, port=taken)
    # Ports chosen here: the race is retried on fresh ones.
    chosen, real_free_port = iter([taken]), ts.free_port
    monkeypatch.setattr(ts, "free_port", lambda: next(chosen, None) or real_free_port())
    server = start_temporal_dev_server(tmp_path / "retried", ui=False)
    try:
        port = int(server.address.rsplit(":", 1)[1])
        assert port != taken and port in listening_ports(server.process.pid)
    finally:
        server.stop()
