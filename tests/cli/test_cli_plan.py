"""``build`` refusals and ``build --plan --json`` through a real Temporal dev server and worker.

A plan resolves everything (new build commit, tags, job specs) and submits nothing: no Iris job and
no branch on the remote. Secrets appear only as names.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from clients.iris import IrisClient
from domain.models import PipelineReport
from tests.cli.starter_cli import starter
from tests.visibility import workflows_started_on

pytestmark = pytest.mark.stack


def _refs(url: str) -> set[str]:
    out = subprocess.run(["git", "ls-remote", url], capture_output=True, text=True, check=True).stdout
    return set(out.splitlines())


async def test_build_without_request_flags_is_refused_and_starts_nothing(service_stack):
    s = service_stack
    refused = await starter(s.config_path, "build", "--arch", "amd64", "--variant", "standard")
    assert refused.code == 2
    assert "--requested-by" in refused.err and "--reason" in refused.err
    assert "workflow:" not in refused.out
    assert await workflows_started_on(s.client, s.task_queue) == []


async def test_plan_uses_the_new_build_commit_and_submits_nothing(service_stack):
    s = service_stack
    refs_before = _refs(s.remotes.marinskyrl_url)
    base = s.remotes.marinskyrl_head
    try:
        # A plan takes seconds; the bound only keeps a hanging plan from costing the suite minutes.
        plan = await starter(s.config_path, "build", "--arch", "amd64", "--variant", "standard",
                             "--variant", "megatron", "--cluster", "amd64=sandbox-amd64",
                             "--requested-by", "tester", "--reason", "cli plan test", "--plan", "--json",
                             timeout=60)
    finally:
        await _terminate_running(s.client, s.task_queue)
    assert plan.code == 0, plan.text
    assert plan.err.startswith("workflow: gpu-rl-build-")  # notes go to stderr: stdout is pure JSON
    rep = PipelineReport.model_validate(json.loads(plan.out))
    assert rep.status == "planned" and rep.workflow_id.endswith("-plan")
    src = rep.source
    assert src.base_commit == base
    assert src.build_commit != base and src.created_commit and not src.pushed
    assert sorted(t.key for t in rep.plan) == ["amd64-megatron", "amd64-standard"]
    for t in rep.plan:
        assert src.build_commit in t.tag and base not in t.tag
        assert t.cluster == "sandbox-amd64"
        secret_env = [e for e in t.job.env if e.secret]
        assert {e.secret for e in secret_env} == {"registry_user", "registry_token"}
        assert all(e.value is None for e in secret_env), "a plan names secrets, never carries their values"
    assert len({t.tag for t in rep.plan}) == 2, "standard and megatron tags must stay distinct"
    for secret in (s.token_registry.push_token, s.github.token):
        assert secret and secret not in plan.text

    # Nothing submitted, nothing pushed; no target child workflow was started.
    revision = s.config.clusters["sandbox-amd64"].client_revision_date
    async with IrisClient(s.iris.url, client_revision_date=revision) as iris:
        for t in rep.plan:
            assert await iris.list_jobs(prefix=f"/gpu-rl-builder/{t.job.job_name}") == []
    assert _refs(s.remotes.marinskyrl_url) == refs_before
    assert await workflows_started_on(s.client, s.task_queue) == [rep.workflow_id]


async def _terminate_running(client, queue: str) -> None:
    """Leave no pipeline retrying on the shared server after this test."""
    async for wf in client.list_workflows(f"TaskQueue = '{queue}' AND ExecutionStatus = 'Running'"):
        try:
            await client.get_workflow_handle(wf.id).terminate(reason="test cleanup")
        except Exception:  # noqa: BLE001 - already closed
            pass
