"""``build`` twice for the same commits: one pipeline, and the second command says it attached.

Uses a task queue served only by a stand-in pipeline workflow that says it is running and waits, so the
pipeline stays running without costing a build. A queue nobody polls is refused before anything starts.
"""

from __future__ import annotations

import re
import uuid

import pytest
from temporalio import workflow
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from tests.cli.starter_cli import starter

pytestmark = pytest.mark.stack

BUILD = ("build", "--arch", "amd64", "--variant", "standard", "--requested-by", "tester", "--reason", "attach")


def _idle_queue_config(stack, tmp_path):
    """The stack's configuration on a fresh task queue nobody serves."""
    queue = f"idle-{uuid.uuid4().hex[:8]}"
    text = re.sub(r'task_queue = "[^"]*"', f'task_queue = "{queue}"', stack.config_path.read_text())
    assert queue in text
    path = tmp_path / "idle.toml"
    path.write_text(text)
    return path




@workflow.defn(name="BuildPipelineWorkflow")
class PipelineStandin:
    """Takes the pipeline's input, reports it runs (past planning) and waits until terminated."""

    @workflow.run
    async def run(self, inp: dict) -> None:
        from runtime import search_attributes as sa

        workflow.upsert_search_attributes([sa.STAGE.value_set("running")])
        await workflow.wait_condition(lambda: False)


def _queue_of(cfg) -> str:
    return re.search(r'task_queue = "([^"]*)"', cfg.read_text()).group(1)


async def test_a_build_nobody_can_check_is_refused_before_anything_starts(service_stack, tmp_path):
    s = service_stack
    cfg = _idle_queue_config(s, tmp_path)
    r = await starter(cfg, *BUILD)
    assert r.code == 3, r.text
    assert f"no worker polls task queue {_queue_of(cfg)}" in r.err and "nothing was started" in r.err
    assert "workflow:" not in r.out


async def test_second_build_for_the_same_commits_attaches(service_stack, tmp_path):
    s = service_stack
    cfg = _idle_queue_config(s, tmp_path)
    async with Worker(s.client, task_queue=_queue_of(cfg), workflows=[PipelineStandin],
                      workflow_runner=UnsandboxedWorkflowRunner()):
        await _attach_twice(s, cfg)


async def _attach_twice(s, cfg):
    first = await starter(cfg, *BUILD)
    wid = first.out.splitlines()[0].removeprefix("workflow: ")
    try:
        assert first.code == 0 and wid.startswith("gpu-rl-build-"), first.text
        run_id = (await s.client.get_workflow_handle(wid).describe()).run_id
        second = await starter(cfg, *BUILD)
        assert second.code == 0, second.text
        assert (await s.client.get_workflow_handle(wid).describe()).run_id == run_id
        assert second.out.splitlines()[0] == f"workflow: {wid} (attached to the running pipeline)"
    finally:
        await s.client.get_workflow_handle(wid).terminate(reason="test cleanup")
