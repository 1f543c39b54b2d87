"""``follow`` tells the truth about the service: it rides out a Temporal restart, says within seconds
that no worker serves the queue (also when a dead worker's poller is still listed), keeps the SDK
core's log lines off the terminal, never cuts a job's state at 80 columns, prints at least one plain
line a minute, and redraws the live table only on change.

The followed build is a stand-in pipeline (a workflow of the same type that reports a running target
and waits), so these tests cost no Iris job; the Temporal servers and the CLI are real."""

from __future__ import annotations

import asyncio
import io
import uuid

import pytest
from temporalio import workflow
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from domain.models import JobProgress, Stage, TargetStatus
from runtime import progress
from sandbox.temporal_server import start_temporal_dev_server
from starter import RECONNECT_RETRY_S
from tests.cli.starter_cli import Follower, minimal_config

REQUEST = {"architectures": ["amd64"], "variants": ["standard"], "compatibility_request": None}
JOB_45 = "gpurl-kaniko-amd64-megatron-0a1b2c3d-r2-abcdefg"[:45]



@workflow.defn(name="BuildPipelineWorkflow")
class RunningPipeline:
    """Says it is running (stage search attribute, a report query) and waits until terminated."""

    @workflow.run
    async def run(self, inp: dict) -> None:
        from runtime import search_attributes as sa

        workflow.upsert_search_attributes([sa.STAGE.value_set("running")])
        await workflow.wait_condition(lambda: False)

    @workflow.query
    def report(self) -> dict:
        return {"workflow_id": workflow.info().workflow_id, "status": "running", "request": REQUEST}


def _worker(client: Client, queue: str) -> Worker:
    return Worker(client, task_queue=queue, workflows=[RunningPipeline], workflow_runner=UnsandboxedWorkflowRunner())


async def _start(client: Client, queue: str) -> str:
    wid = f"gpu-rl-build-follow-{uuid.uuid4().hex[:8]}"
    await client.start_workflow("BuildPipelineWorkflow", {"request": REQUEST, "request_id": wid}, id=wid,
                                task_queue=queue)
    return wid


async def _running(client: Client, wid: str) -> None:
    """The stand-in's first workflow task is done (its search attribute is set)."""
    for _ in range(200):
        desc = await client.get_workflow_handle(wid).describe()
        if desc.search_attributes.get("BuildStage"):
            return
        await asyncio.sleep(0.1)
    raise AssertionError("stand-in pipeline did not start")


async def test_a_dead_workers_queue_is_named(temporal_dev_server, temporal_client, tmp_path):
    queue = f"follow-dead-{uuid.uuid4().hex[:6]}"
    async with _worker(temporal_client, queue):
        wid = await _start(temporal_client, queue)
        await _running(temporal_client, wid)
    # The worker is gone, but its poller stays in DescribeTaskQueue for minutes.
    follower = await Follower.start(minimal_config(tmp_path, temporal_dev_server.address, queue), "follow", wid)
    try:
        await follower.read_until(lambda x: x.startswith("following "), timeout=60)  # it starts waiting
        line = await follower.read_until(lambda x: "no worker is polling" in x, timeout=60)
    finally:
        follower.stop()
        await temporal_client.get_workflow_handle(wid).terminate()
    assert queue in line, line


async def test_follow_rides_out_a_temporal_restart_and_keeps_sdk_logs_off_the_terminal(tmp_path):
    server = start_temporal_dev_server(tmp_path / "t1", ui=False)
    port = int(server.address.rsplit(":", 1)[1])
    queue = f"follow-blip-{uuid.uuid4().hex[:6]}"
    follower = None
    try:
        client = await Client.connect(server.address, namespace=server.namespace,
                                      data_converter=pydantic_data_converter)
        from temporalio.api.enums.v1 import IndexedValueType
        from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
        await client.operator_service.add_search_attributes(AddSearchAttributesRequest(
            namespace=client.namespace, search_attributes={"BuildStage": IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD}))
        async with _worker(client, queue):
            wid = await _start(client, queue)
            await _running(client, wid)
            follower = await Follower.start(minimal_config(tmp_path, server.address, queue), "follow", wid, "--interval", "1")
            await follower.read_until(lambda x: wid in x, timeout=60)
            server.stop()  # Temporal goes away for two more of follow's retry rounds ...
            await follower.read_until(lambda x: "reconnecting" in x, timeout=60)
            await asyncio.sleep(2 * RECONNECT_RETRY_S)
            server = start_temporal_dev_server(tmp_path / "t1", ui=False, port=port)  # ... and comes back
            await follower.read_until(lambda x: "reconnected" in x, timeout=120)
            assert follower.proc.returncode is None  # still following
            client2 = await Client.connect(server.address, namespace=server.namespace)
            await client2.get_workflow_handle(wid).terminate()
            code = await follower.finish(timeout=120)
    finally:
        if follower:
            follower.stop()
        server.stop()
    text = "\n".join(follower.lines) + follower.err
    assert code != 3, text  # it carried on until the build ended (terminated: exit 1), not "unreachable"
    assert "temporal_sdk_core" not in text and "temporal_client" not in text and "\x1b[" not in text, text


def _status(job: str, preemptions: int) -> TargetStatus:
    return TargetStatus(key="amd64-megatron", stage=Stage.RUNNING, job_ids=[f"/gpu-rl-builder/{job}"],
                        progress=JobProgress(job_id=job, state="running", terminal=False, preemptions=preemptions,
                                             last_marker="[arch] build host=x86_64", elapsed_s=754))


def test_a_45_character_job_id_never_hides_its_state_in_80_columns():
    assert len(JOB_45) == 45
    rows = progress.rows(None, {"amd64-megatron": _status(JOB_45, 2)})
    assert rows[0].job.endswith("(running) preempted×2")
    from rich.console import Console

    out = io.StringIO()
    console = Console(file=out, width=80, force_terminal=False, color_system=None)
    view = progress.LiveView(console=Console(file=io.StringIO(), width=80))
    try:
        console.print(view.render("wf-id", "running", rows, []))
    finally:
        view.close()
    lines = out.getvalue().splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert any("preempted×2" in line for line in lines), out.getvalue()
    assert any("(running)" in line for line in lines), out.getvalue()
    plain: list[str] = []
    progress.PlainView(plain.append).update("wf-id", "running", rows, [])
    assert any("(running) preempted×2" in line for line in plain)


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_plain_mode_prints_well_within_every_minute_when_the_loop_wakes_when_due():
    clock, lines = Clock(), []
    view = progress.PlainView(lambda line: lines.append((clock.t, line)), clock=clock)
    rows = progress.rows(None, {"amd64-megatron": _status(JOB_45, 0)})
    printed_at = []
    for _ in range(200):  # the follow loop: poll (3 s under load), update, sleep min(interval, due_in)
        clock.t += 3.0
        n = len(lines)
        view.update("wf", "running", rows, [])
        if len(lines) > n:
            printed_at.append(clock.t)
        clock.t += max(0.5, min(15.0, view.due_in()))
    gaps = [b - a for a, b in zip(printed_at, printed_at[1:], strict=False)]
    assert gaps and max(gaps) <= 50, max(gaps)


def test_the_live_table_redraws_only_on_change_and_at_most_once_a_second():
    from rich.console import Console

    clock = Clock()
    view = progress.LiveView(console=Console(file=io.StringIO(), width=80, force_terminal=True), clock=clock)
    try:
        for i in range(600):  # ten minutes of polls every second; elapsed ticks, nothing else changes
            clock.t = float(i)
            st = _status(JOB_45, 0)
            st.progress.elapsed_s = 754 + i
            view.update("wf", "running", progress.rows(None, {"amd64-megatron": st}), [])
        # Issue 38.5: the elapsed time ticks on screen (it froze between changes), every LIVE_TICK_S, not per poll.
        assert view.redraws == 600 / progress.LIVE_TICK_S
        base = view.redraws
        clock.t = 600.2
        view.update("wf", "validating", progress.rows(None, {"amd64-megatron": _status(JOB_45, 1)}), [])
        clock.t = 600.5  # another change within the second: not drawn yet ...
        view.update("wf", "done", progress.rows(None, {"amd64-megatron": _status(JOB_45, 1)}), [])
        assert view.redraws == base + 1
        clock.t = 601.3  # ... but at the next poll
        view.update("wf", "done", progress.rows(None, {"amd64-megatron": _status(JOB_45, 1)}), [])
        assert view.redraws == base + 2
    finally:
        view.close()


__all__ = ["pytest"]
