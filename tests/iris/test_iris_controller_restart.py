"""Controller stopped and restarted mid-monitoring, on its own controller (not the session one).

Observed with 0.2.20 local mode: while the controller is down every call raises ``Unavailable``
(never a terminal state). Restarted on the same state dir and port, the controller restores its job
table from SQLite: the job is still known under the same id. Its task process died with the old
controller (local workers are threads of the controller process), so the job then moves on by the
controller's own rules: the dead worker is reaped (~10 s) and the attempt becomes WORKER_FAILED
with ``is_worker_failure`` (retried under the preemption budget, terminal once it is spent).
"""

from __future__ import annotations

import datetime

import pytest

from clients.iris import IrisClient, JobState, TaskState, Unavailable
from sandbox.iris_controller import _processes_with_marker, start_iris_controller
from tests.iris.helpers import bash_spec, wait_for, wait_terminal

pytestmark = pytest.mark.stack


async def test_restart_mid_monitoring(tmp_path):
    state = tmp_path / "ctl"
    first = start_iris_controller(state)
    today = datetime.date.today().isoformat()
    client = IrisClient(first.url, client_revision_date=today, max_attempts=2, backoff_s=0.05, timeout_s=5)
    second = None
    try:
        name = "/tester/survives-restart"
        await client.launch_job(bash_spec(name, "echo started; sleep 120", max_retries_preemption=0))
        await wait_for(client, name, lambda i: i.state is JobState.RUNNING)
        first.stop()
        assert _processes_with_marker(first.marker) == []  # controller and its task are gone
        with pytest.raises(Unavailable):
            await client.job_status(name)
        with pytest.raises(Unavailable):
            await client.job_states([name])
        assert not await client.health()

        second = start_iris_controller(state, port=first.port)
        info = await client.job_status(name)
        assert info.job_id == name
        assert not info.state.is_terminal  # restored as it was: still running
        # The old worker never reconciles again: the controller reaps it and fails the attempt as a
        # worker failure (preemption budget 0 here, so the job ends WORKER_FAILED).
        final = await wait_terminal(client, name, timeout_s=120)
        assert final.state is JobState.WORKER_FAILED
        attempts = (await client.task_status(f"{name}/0")).attempts
        assert [(a.state, a.is_worker_failure) for a in attempts] == [(TaskState.WORKER_FAILED, True)]
    finally:
        await client.aclose()
        first.stop()
        if second:
            second.stop()
