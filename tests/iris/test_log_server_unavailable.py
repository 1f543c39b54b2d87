"""No log server behind the controller's endpoint proxy is a transient failure, never a verdict on the job.

Production can meet it: the controller routes ``/proxy/system.log-server/...`` through its endpoint registry,
and a log read while ``/system/log-server`` is not registered (or a URL that reaches another listener than the
controller's public one, as in the CI flake, tests/iris/test_iris_controller_start.py) answers HTTP 404. It used
to surface as ``NotFound``, the error of a job the controller no longer knows: ``monitor_job`` ended a running
job as "missing", a failure's evidence said the controller no longer knew the job, and a log check failed
for good. Both ways of meeting it here are real marin-iris listeners (tests/iris/helpers.py).
"""

from __future__ import annotations

import pytest
from temporalio.testing import ActivityEnvironment

from activities.build import BuildActivities
from activities.errors import Transient, classify_exception
from clients.iris import IrisClient, JobState, LogServerUnavailable, NotFound, Unavailable
from domain.config import ServiceConfig
from domain.models import MonitorInput
from tests.iris.helpers import bash_spec, private_listener, proxy_without_log_server, wait_for

pytestmark = pytest.mark.stack


@pytest.fixture(params=["registry without the log server", "private listener"])
def no_log_server_url(request, iris_controller):
    """A URL of the session controller at which RPCs work and no log server answers."""
    if request.param == "private listener":
        yield f"http://127.0.0.1:{private_listener(iris_controller)}"
    else:
        with proxy_without_log_server(iris_controller.url) as url:
            yield url


async def test_a_log_read_with_no_log_server_is_transient_bounded_and_named(no_log_server_url):
    async with IrisClient(no_log_server_url, max_attempts=3, backoff_s=0.01) as client:
        assert await client.health()  # the controller itself answers
        with pytest.raises(LogServerUnavailable) as err:
            await client.fetch_logs("/tester/", "prefix")
        assert client.requests["FetchLogs"] == 3  # retried with backoff, bounded by max_attempts
    e = err.value
    assert e.transient and isinstance(e, Unavailable) and not isinstance(e, NotFound)
    assert "/proxy/system.log-server" in str(e) and "HTTP 404" in str(e) and "nothing is concluded" in str(e)
    failure = classify_exception(e)
    assert isinstance(failure, Transient) and not failure.non_retryable


async def test_the_proxys_own_404_reason_is_quoted(iris_controller):
    with proxy_without_log_server(iris_controller.url) as url:
        async with IrisClient(url, max_attempts=1) as client:
            with pytest.raises(LogServerUnavailable, match="No endpoint 'system.log-server'"):
                await client.fetch_logs("/tester/", "prefix")


async def test_monitoring_a_running_job_without_its_logs_keeps_it_running(no_log_server_url, iris_client,
                                                                        iris_job_name, tmp_path):
    name = iris_job_name("nolog")
    await iris_client.launch_job(bash_spec(name, "echo step-1-done; sleep 120"))
    try:
        await wait_for(iris_client, name, lambda i: i.state is JobState.RUNNING)
        config = ServiceConfig.model_validate({
            "work_dir": str(tmp_path),
            "repos": {"marinskyrl_url": "file:///nowhere", "harbor_url": "file:///nowhere"},
            "clusters": {"c": {"controller_url": no_log_server_url}},
            "registry": {"image_repository": "127.0.0.1:5000/gpu-rl", "user": {"kind": "literal_public", "value": "u"},
                         "token": {"kind": "env", "name": "X"}},
            "policy": {"poll_min_interval_s": 0.1, "poll_max_interval_s": 0.2},
        })
        progress = await ActivityEnvironment().run(
            BuildActivities(config).monitor_job,
            MonitorInput(job_id=name, cluster="c", return_after_s=1.0, log_cursor=7, markers=["step-1-done"]))
    finally:
        await iris_client.terminate(name)
    assert progress.state == "running" and not progress.terminal and not progress.missing
    assert progress.controller_reachable  # the state was read: only the log lines were not
    assert progress.log_cursor == 7 and progress.last_marker is None  # nothing read, nothing made up
    assert progress.error and progress.error.startswith("log progress not read") and "log server" in progress.error
