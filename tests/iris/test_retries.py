"""Retries as the CLI means them (issue #17 item 4), on the real 0.2.227 controller.

``iris job run --max-retries N`` sends ``max_retries_failure=N`` and ``max_task_failures=N``
(iris/cli/job.py); 0.2.227 fails a job whose failed tasks exceed ``max_task_failures`` even while the
task has retries left. The arm64 spec the service plans from the real ops doc (``--max-retries 3``)
must reach the controller with both, and a job failing once on it must be retried by Iris."""

from __future__ import annotations

import uuid

import pytest

from activities.build import launch_spec
from clients.iris import JobState, TaskState
from tests.contract.real import real_contract
from tests.contract.test_real_prose import plan
from tests.iris.helpers import wait_terminal

pytestmark = pytest.mark.stack


def _fail_once(flag) -> list[str]:
    return ["bash", "-c", f"if [ -e {flag} ]; then echo second-attempt-ok; else touch {flag}; exit 1; fi"]


async def test_arm64_spec_reads_back_with_max_task_failures_and_is_retried(iris_client, tmp_path):
    arm = plan(real_contract(tmp_path, "era-c"))["arm64-standard"]
    assert arm.job.max_retries_failure == 3  # the ops doc's --max-retries 3
    name = f"/tester/arm64-retry-{uuid.uuid4().hex[:8]}"
    spec = launch_spec(arm.job, name, {}, None).model_copy(update={"argv": _fail_once(tmp_path / "flag")})
    assert spec.resources.gpu and spec.resources.gpu.variant == "GB200"
    await iris_client.launch_job(spec)
    echoed = (await iris_client._call("GetJobStatus", {"jobId": name}))["request"]  # noqa: SLF001
    assert (echoed["maxRetriesFailure"], echoed["maxTaskFailures"]) == (3, 3)
    info = await wait_terminal(iris_client, name, timeout_s=180)
    assert info.state is JobState.SUCCEEDED and info.failure_count == 1
    attempts = (await iris_client.task_status(f"{name}/0")).attempts
    assert [a.state for a in attempts] == [TaskState.FAILED, TaskState.SUCCEEDED]


async def test_max_retries_failure_alone_is_no_retry_on_this_release(iris_client, tmp_path):
    """What the client sent before: 3 retries on the task, job-level budget 0 → FAILED at once."""
    arm = plan(real_contract(tmp_path, "era-c"))["arm64-standard"]
    name = f"/tester/arm64-noretry-{uuid.uuid4().hex[:8]}"
    spec = launch_spec(arm.job, name, {}, None).model_copy(
        update={"argv": _fail_once(tmp_path / "flag"), "max_task_failures": 0})
    await iris_client.launch_job(spec)
    info = await wait_terminal(iris_client, name, timeout_s=180)
    assert info.state is JobState.FAILED
    assert [a.state for a in (await iris_client.task_status(f"{name}/0")).attempts] == [TaskState.FAILED]
