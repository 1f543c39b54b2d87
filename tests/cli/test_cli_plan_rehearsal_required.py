"""`build --plan` on a worker that cannot isolate, with policy.rehearsal = "required" (the shipped default):
refused before anything is submitted, naming the setting and what the host lacks (real Temporal, worker,
CLI and the real era-C tree; the worker's bwrap answers as under the RuntimeDefault seccomp profile and it
has no proot)."""

from __future__ import annotations

import pytest

from rehearsal import runner
from tests.cli.test_cli_plan_real import _plan, _report
from tests.real_tree_stack import real_tree_service

pytestmark = pytest.mark.stack


async def test_plan_refused_when_rehearsal_is_required_and_the_worker_cannot_isolate(service_config, request,
                                                                                      monkeypatch, tmp_path):
    refused = tmp_path / "bwrap"
    refused.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace, likely because the kernel "
                       "does not allow non-privileged user namespaces.' >&2\nexit 1\n")
    refused.chmod(0o755)
    monkeypatch.setattr(runner, "bwrap_path", lambda: str(refused))  # the in-process worker's rehearsal
    monkeypatch.setattr(runner.proot, "proot_path", lambda: None)
    async with real_tree_service(service_config, "era-c", request.node.nodeid) as s:
        assert s.config.policy.rehearsal == "required"
        ran = await _plan(s, "--arch", "amd64", "--variant", "standard", "--cluster", "amd64=sandbox-amd64")
    assert ran.code == 2, ran.text
    f = _report(ran.out).failure
    assert f.failure_class == "input"
    assert 'policy.rehearsal = "required"' in f.message and "nothing was submitted" in f.message
    assert "No permissions to create new namespace" in f.message and "deploy/README.md" in f.message
    assert "proot is not installed" in f.message
