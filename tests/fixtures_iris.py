"""Session fixtures for the real local Iris controller (marin-iris 0.2.227, local mode).

``iris_controller``: one controller subprocess per test session (started lazily, stopped with all its
tasks at session end); its per-task-timeout scan runs every 1 s instead of the controller's 60 s so the
timeout test stays short. Everything it prints is kept in ``<basetemp>/iris-controller0/controller-<ms>.log``
(per xdist worker: ``<basetemp>/popen-gwN/iris-controller0/``). Before each test that uses it, it is checked
(``IrisControllerHandle.check``: process alive, ``/health``, the log server behind the endpoint proxy): a
controller that broke fails the test's setup once with what broke and that log's path, instead of every
later log read failing with a bare 404. ``iris_client``: an ``IrisClient`` bound to it sending its own marin-iris
build date as ``client_revision_date`` (clients/iris_pin.py; the controller's freshness gate stays on).
"""

from __future__ import annotations

import uuid

import pytest

from clients.iris import IrisClient
from sandbox.iris_controller import IrisControllerHandle, start_iris_controller


@pytest.fixture(scope="session")
def iris_controller_session(tmp_path_factory) -> IrisControllerHandle:
    handle = start_iris_controller(tmp_path_factory.mktemp("iris-controller"), timeout_scan_interval_s=1.0)
    yield handle
    handle.stop()


@pytest.fixture
def iris_controller(iris_controller_session) -> IrisControllerHandle:
    """The session's controller, checked before it is handed to the test (not retried: a broken shared
    controller is reported as what it is)."""
    problem = iris_controller_session.check()
    if problem is not None:
        pytest.fail(f"the session's Iris controller is not usable: {problem}", pytrace=False)
    return iris_controller_session


@pytest.fixture
async def iris_client(iris_controller) -> IrisClient:
    client = IrisClient(
        iris_controller.url,
        timeout_s=15.0,
        cluster_name="local",
    )
    yield client
    await client.aclose()


@pytest.fixture
def iris_job_name():
    """A fresh full wire job id per call: ``iris_job_name("what")`` → ``/tester/what-<hex>``."""
    return lambda label="job": f"/tester/{label}-{uuid.uuid4().hex[:8]}"
