"""gpu-rl-builder-setup-namespace against the sandbox dev server: creates a namespace, sets retention,
registers every search attribute, and a second run changes nothing."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path

from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest

from runtime import search_attributes

ROOT = Path(__file__).resolve().parents[2]


def _setup(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "GPU_RL_BUILDER_"))}
    return subprocess.run([sys.executable, "-m", "runtime.namespace_setup", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


async def test_setup_creates_configures_and_is_idempotent(temporal_dev_server, temporal_client):
    namespace = f"setup-{uuid.uuid4().hex[:8]}"
    base = ("--address", temporal_dev_server.address, "--namespace", namespace)
    missing = await asyncio.to_thread(_setup, *base)
    assert missing.returncode == 1 and f"namespace {namespace!r} does not exist: pass --create" in missing.stderr

    first = await asyncio.to_thread(_setup, *base, "--create", "--retention-days", "7")
    assert first.returncode == 0, first.stderr
    assert f"created namespace {namespace}" in first.stdout and "added search attributes" in first.stdout
    described = await temporal_client.workflow_service.describe_namespace(DescribeNamespaceRequest(namespace=namespace))
    assert described.config.workflow_execution_retention_ttl.ToTimedelta() == timedelta(days=7)
    listed = await temporal_client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=namespace))
    assert {k.name for k in search_attributes.ALL} <= set(listed.custom_attributes)

    again = await asyncio.to_thread(_setup, *base, "--retention-days", "7")
    assert again.returncode == 0 and "nothing to change" in again.stdout, again.stdout + again.stderr
    longer = await asyncio.to_thread(_setup, *base, "--retention-days", "10")
    assert longer.returncode == 0 and "-> 10 d" in longer.stdout, longer.stderr
    described = await temporal_client.workflow_service.describe_namespace(DescribeNamespaceRequest(namespace=namespace))
    assert described.config.workflow_execution_retention_ttl.ToTimedelta() == timedelta(days=10)


def test_unreachable_server_is_exit_3():
    ran = _setup("--address", "127.0.0.1:1", "--namespace", "x")
    assert ran.returncode == 3 and "127.0.0.1:1" in ran.stderr
