"""A dependency that stays unreachable ends the step with its last error, never an unbounded silent retry.

Real workflows and the REAL activity for the unreachable service (Iris submit, GitHub watch) against a
closed port, the rest scripted; the time-skipping server fast-forwards the retry backoff, so the
whole budget (workflows/options.py: about 30 minutes, 2 hours for the merge wait) passes in seconds.
"""

from __future__ import annotations

import functools
import socket
import uuid

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ActivityError, ApplicationError, RetryState
from temporalio.worker import Worker

from activities import common
from activities.build import BuildActivities
from activities.record import RecordActivities
from clients.iris import IrisClient
from domain.config import ServiceConfig
from domain.models import PipelineInput
from runtime import progress
from tests.contract.helpers import COMMIT
from tests.workflows.standins import Standins, eventually, request, result, target_input
from workflows.pipeline import BuildPipelineWorkflow
from workflows.target import TargetBuildWorkflow

KEY = "amd64-standard"


def _closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def _config(tmp_path) -> ServiceConfig:
    return ServiceConfig.model_validate({
        "work_dir": str(tmp_path / "work"),
        "repos": {"marinskyrl_url": "file:///nonexistent/m", "harbor_url": "file:///nonexistent/h"},
        "clusters": {"cw-rno2a": {"controller_url": _closed_port_url(), "client_revision_date": "2026-01-01"}},
        "registry": {"image_repository": "127.0.0.1:5000/gpu-rl", "user": {"kind": "literal_public", "value": "u"}, "token": {"kind": "env", "name": "GRB_T"}},
        "github": {"token": {"kind": "env", "name": "GRB_T"}, "api_url": _closed_port_url()},
    })


def _with_real(standins: Standins, *real) -> list:
    names = {fn.__name__ for fn in real}
    return [a for a in standins.all() if a.__name__ not in names] + list(real)


def _last_error(err: BaseException) -> ApplicationError:
    """The activity ran out of attempts; the failure carries the last attempt's error."""
    while err is not None and not isinstance(err, ActivityError):  # e.g. wrapped as BuildFailed by the pipeline
        err = err.cause
    assert isinstance(err, ActivityError), err
    assert err.retry_state == RetryState.MAXIMUM_ATTEMPTS_REACHED, err.retry_state
    assert isinstance(err.cause, ApplicationError), err.cause
    return err.cause


async def test_iris_unreachable_beyond_the_budget_fails_the_target_with_the_last_error(
        time_skipping_env, tmp_path, monkeypatch):
    env = time_skipping_env
    # One try per activity attempt (the client's own short retries only cost wall time here).
    monkeypatch.setattr(common, "IrisClient", functools.partial(IrisClient, max_attempts=1))
    wid, tq = f"wf-unreachable-{uuid.uuid4().hex[:8]}", f"tq-{uuid.uuid4().hex[:8]}"
    s = Standins()
    real = BuildActivities(_config(tmp_path))
    async with Worker(env.client, task_queue=tq, workflows=[TargetBuildWorkflow],
                      activities=_with_real(s, real.submit_job)):
        handle = await env.client.start_workflow(TargetBuildWorkflow.run, target_input(wid), id=wid, task_queue=tq)
        with pytest.raises(WorkflowFailureError) as info:
            await result(handle)
    last = _last_error(info.value.cause)
    assert last.type == "Transient" and "cannot reach controller" in last.message
    assert not s.names("monitor_job")  # nothing after the failed submit ran


async def test_github_unreachable_beyond_the_budget_ends_the_merge_wait_with_the_last_error(
        time_skipping_env, tmp_path, monkeypatch):
    env = time_skipping_env
    token = "ghp_" + uuid.uuid4().hex + uuid.uuid4().hex[:4]  # random: the redactor learns it process-wide
    monkeypatch.setenv("GRB_T", token)
    wid, tq = f"pipeline-unreachable-{uuid.uuid4().hex[:8]}", f"tq-{uuid.uuid4().hex[:8]}"
    s = Standins()
    real = RecordActivities(_config(tmp_path))
    async with Worker(env.client, task_queue=tq, workflows=[BuildPipelineWorkflow, TargetBuildWorkflow],
                      activities=_with_real(s, real.watch_pull_request)):
        handle = await env.client.start_workflow(
            BuildPipelineWorkflow.run, PipelineInput(request=request(), request_id=wid, source_commit=COMMIT),
            id=wid, task_queue=tq)
        with pytest.raises(WorkflowFailureError) as info:
            await result(handle)
    last = _last_error(info.value.cause)
    assert last.type == "Transient" and "GitHub unreachable" in last.message
    assert "GitHub unreachable" in info.value.cause.message  # the build's own failure names the real cause
    assert token[4:] not in str(last.message)
    assert s.names("record_artifact") and not s.names("merge_pull_request")


async def test_a_retrying_step_shows_in_progress_with_its_attempt_and_last_error(temporal_client, tmp_path,
                                                                                  monkeypatch):
    """Real time (dev server): while Iris is unreachable, `starter.py follow` shows the retrying step."""
    monkeypatch.setattr(common, "IrisClient", functools.partial(IrisClient, max_attempts=1))
    wid, tq = f"wf-retrying-{uuid.uuid4().hex[:8]}", f"tq-{uuid.uuid4().hex[:8]}"
    s = Standins()
    real = BuildActivities(_config(tmp_path))
    async with Worker(temporal_client, task_queue=tq, workflows=[TargetBuildWorkflow],
                      activities=_with_real(s, real.submit_job)):
        handle = await temporal_client.start_workflow(TargetBuildWorkflow.run, target_input(wid), id=wid,
                                                      task_queue=tq)
        try:
            async def shown():
                pending = (await handle.describe()).raw_description.pending_activities
                return progress.retrying(pending, KEY)
            (reason,) = await eventually(shown, what="a retried submit", attempts=600)
        finally:
            await handle.terminate("test over")
    assert reason.kind == "step_retrying" and reason.target == KEY
    assert "submit_job failed (attempt" in reason.detail and "cannot reach controller" in reason.detail
    line, next_step = progress.wait_lines([reason])
    assert line.startswith(f"WAITING {KEY}: submit_job failed")
    assert next_step.startswith("  next: nothing to run: the step is retried with backoff")  # issue 38.5
