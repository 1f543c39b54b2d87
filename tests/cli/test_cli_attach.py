"""``build`` twice for the same commits: one pipeline, and the second command says it attached.

Uses a task queue no worker polls, so the pipeline stays running without costing a build.
"""

from __future__ import annotations

import re
import uuid

import pytest

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




async def test_second_build_for_the_same_commits_attaches(service_stack, tmp_path):
    s = service_stack
    cfg = _idle_queue_config(s, tmp_path)
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
