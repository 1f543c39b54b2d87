"""IrisClient against a real marin-iris 0.2.227 controller in local mode (tasks are host processes)."""

from __future__ import annotations

import datetime
import json

import pytest

from clients.iris import (
    ClientTooOld,
    FailedPrecondition,
    GpuRequest,
    InvalidArgument,
    IrisClient,
    JobState,
    NotFound,
    Resources,
    TaskState,
)
from tests.iris.helpers import SMALL, bash_spec, wait_for, wait_terminal

pytestmark = pytest.mark.stack


async def test_health_and_workers(iris_client):
    assert await iris_client.health()
    assert await iris_client.cluster_arch_hint() is None  # local workers advertise no architecture


async def test_success_exit_zero(iris_client, iris_job_name):
    name = iris_job_name("ok")
    job_id = await iris_client.launch_job(bash_spec(name, "echo hello-from-task"))
    assert job_id == name
    info = await wait_terminal(iris_client, job_id)
    assert info.state is JobState.SUCCEEDED
    assert info.exit_code == 0
    assert [t.state for t in info.tasks] == [TaskState.SUCCEEDED]


async def test_nonzero_exit_carries_stderr_and_task_exit_code(iris_client, iris_job_name):
    name = iris_job_name("fail")
    await iris_client.launch_job(bash_spec(name, "echo doomed-line >&2; exit 7"))
    info = await wait_terminal(iris_client, name)
    assert info.state is JobState.FAILED
    assert info.exit_code == 7  # from the task: the job-level field stays 0
    assert "Exit code: 7" in info.error
    task = await iris_client.task_status(f"{name}/0")
    assert task.exit_code == 7
    assert [a.state for a in task.attempts] == [TaskState.FAILED]


async def test_failure_retry_budget_gives_all_attempts(iris_client, iris_job_name):
    name = iris_job_name("retry")
    await iris_client.launch_job(bash_spec(name, "exit 2", max_retries_failure=1))
    info = await wait_terminal(iris_client, name)
    assert info.state is JobState.FAILED
    task = await iris_client.task_status(f"{name}/0")
    assert [a.attempt_id for a in task.attempts] == [0, 1]
    assert all(a.exit_code == 2 and not a.is_worker_failure for a in task.attempts)


async def test_per_task_timeout(iris_client, iris_job_name):
    name = iris_job_name("timeout")
    await iris_client.launch_job(bash_spec(name, "sleep 60", timeout_s=2))
    info = await wait_terminal(iris_client, name)
    assert info.state is JobState.FAILED  # 0.2.20: FAILED, not KILLED
    assert "timeout" in info.error.lower()


GB200_NODE = Resources(cpu_millicores=1000, memory_bytes=SMALL.memory_bytes, gpu=GpuRequest(variant="GB200", count=4))


async def test_waiting_for_capacity_pending_reason_then_scheduling_timeout(iris_client, iris_job_name):
    """All four GB200 nodes busy: a fifth whole-node job waits with a reason, and one with a scheduling
    timeout becomes UNSCHEDULABLE (0.2.227 refuses a request no node could hold at launch instead)."""
    blocker = iris_job_name("block")
    await iris_client.launch_job(bash_spec(blocker, "sleep 120", resources=GB200_NODE, replicas=4))
    try:
        await wait_for(iris_client, blocker, lambda i: [t.state for t in i.tasks] == [TaskState.RUNNING] * 4,
                       timeout_s=120)
        waiting = iris_job_name("pending")
        await iris_client.launch_job(bash_spec(waiting, "true", resources=GB200_NODE))
        info = await wait_for(iris_client, waiting, lambda i: bool(i.pending_reason))
        assert info.state is JobState.PENDING
        assert "GPU" in info.pending_reason or "gpu" in info.pending_reason
        await iris_client.terminate(waiting)
        assert (await wait_terminal(iris_client, waiting)).state is JobState.KILLED

        name = iris_job_name("unsched")
        await iris_client.launch_job(bash_spec(name, "true", resources=GB200_NODE, scheduling_timeout_s=2))
        info = await wait_terminal(iris_client, name)
        assert info.state is JobState.UNSCHEDULABLE
        assert "Scheduling timeout" in info.error
    finally:
        await iris_client.terminate(blocker)


async def test_more_cpu_than_any_node_rejected_at_launch(iris_client, iris_job_name):
    big = Resources(cpu_millicores=999_000, memory_bytes=SMALL.memory_bytes, disk_bytes=SMALL.disk_bytes)
    with pytest.raises(FailedPrecondition) as err:
        await iris_client.launch_job(bash_spec(iris_job_name("big"), "true", resources=big))
    assert "unschedulable" in err.value.message and "cpu" in err.value.message


async def test_infeasible_device_rejected_at_launch(iris_client, iris_job_name):
    gpu = Resources(cpu_millicores=1000, memory_bytes=SMALL.memory_bytes, gpu=GpuRequest(variant="H100", count=8))
    with pytest.raises(FailedPrecondition) as err:
        await iris_client.launch_job(bash_spec(iris_job_name("gpu"), "true", resources=gpu))
    assert "unschedulable" in err.value.message


async def test_unknown_job_is_not_found(iris_client):
    with pytest.raises(NotFound):
        await iris_client.job_status("/tester/never-submitted")
    with pytest.raises(NotFound):
        await iris_client.terminate("/tester/never-submitted")
    assert await iris_client.list_tasks("/tester/never-submitted") == []
    assert await iris_client.job_states(["/tester/never-submitted"]) == {}


async def test_idempotent_resubmit_after_crash(iris_client, iris_job_name):
    """A submitter that crashed after LaunchJob re-submits the same name: one job, same id."""
    name = iris_job_name("dup")
    spec = bash_spec(name, "sleep 30")
    first, launched = await iris_client.submit_idempotent(spec)
    assert launched
    again, launched_again = await iris_client.submit_idempotent(spec)
    assert (again, launched_again) == (first, False)
    kept = await iris_client.launch_job(spec)  # KEEP policy on the wire: running job → same id
    assert kept == first
    assert [j.job_id for j in await iris_client.list_jobs(prefix=name)] == [name]
    task = await iris_client.task_status(f"{name}/0")
    assert len(task.attempts) == 1
    await iris_client.terminate(name)
    assert (await wait_terminal(iris_client, name)).state is JobState.KILLED
    # A finished job is attached to, never replaced.
    after, relaunched = await iris_client.submit_idempotent(spec)
    assert (after, relaunched) == (name, False)
    assert (await iris_client.job_status(name)).state is JobState.KILLED


async def test_logs_with_cursor(iris_client, iris_job_name):
    name = iris_job_name("logs")
    await iris_client.launch_job(bash_spec(name, "for i in 1 2 3 4 5; do echo line-$i; done; echo err-line >&2"))
    await wait_terminal(iris_client, name)
    page = await wait_for_logs(iris_client, name, 6)
    data = [e.data for e in page.entries]
    assert [d for d in data if d.startswith("line-")] == [f"line-{i}" for i in range(1, 6)]
    assert {e.source for e in page.entries if e.data == "err-line"} == {"stderr"}
    first = await iris_client.fetch_logs(f"{name}/", max_lines=2)
    assert len(first.entries) == 2
    rest = await iris_client.fetch_logs(f"{name}/", cursor=first.cursor)
    assert [e.data for e in first.entries + rest.entries] == data
    assert (await iris_client.fetch_logs(f"{name}/", cursor=page.cursor)).entries == []
    tail = await iris_client.fetch_logs(f"{name}/0:", tail=True, max_lines=1)
    assert [e.data for e in tail.entries] == [data[-1]]
    exact = await iris_client.fetch_logs(f"{name}/0:0", match_scope="exact")
    assert [e.data for e in exact.entries] == data


async def test_logs_only_behind_the_log_server_proxy(iris_controller, iris_client, iris_job_name):
    """0.2.227 serves FetchLogs only behind the controller's endpoint proxy: the old top-level path is
    404, so a client calling it could never judge a build (issue #17)."""
    import httpx

    from clients.iris import LOG_SERVER_PROXY_PREFIX, LOG_SERVICE

    name = iris_job_name("proxy")
    await iris_client.launch_job(bash_spec(name, "echo via-proxy"))
    await wait_terminal(iris_client, name)
    assert "via-proxy" in (await wait_for_logs(iris_client, name, 1)).lines
    body = {"source": f"{name}/", "matchScope": "MATCH_SCOPE_PREFIX"}
    async with httpx.AsyncClient(base_url=iris_controller.url) as http:
        old = await http.post(f"/{LOG_SERVICE}/FetchLogs", json=body)
        new = await http.post(f"{LOG_SERVER_PROXY_PREFIX}/{LOG_SERVICE}/FetchLogs", json=body)
    assert (old.status_code, new.status_code) == (404, 200)


async def wait_for_logs(client, name, n, tries=50):
    import asyncio

    for _ in range(tries):
        page = await client.fetch_logs(f"{name}/")
        if len(page.entries) >= n:
            return page
        await asyncio.sleep(0.2)
    raise AssertionError(f"only {len(page.entries)} log lines for {name}")


async def test_job_status_never_contains_env_values(iris_client, iris_job_name):
    sentinel = "SENTINEL-9f3c2a71-secret"
    name = iris_job_name("secret")
    spec = bash_spec(name, 'test "$MY_TOKEN" = "$EXPECTED" && echo token-arrived', env={
        "MY_TOKEN": sentinel, "EXPECTED": sentinel})
    assert sentinel not in repr(spec)
    await iris_client.launch_job(spec)
    info = await wait_terminal(iris_client, name)
    assert info.state is JobState.SUCCEEDED  # the env var really reached the task
    assert sentinel not in json.dumps(info.model_dump(mode="json"))
    listed = await iris_client.list_jobs(prefix=name)
    assert sentinel not in json.dumps([j.model_dump(mode="json") for j in listed])
    task = await iris_client.task_status(f"{name}/0")
    assert sentinel not in task.model_dump_json()


async def test_launch_error_message_is_scrubbed_of_env(iris_client, iris_job_name):
    sentinel = "SENTINEL-0b7e-launch"
    gpu = Resources(cpu_millicores=1000, memory_bytes=SMALL.memory_bytes, gpu=GpuRequest(variant="H100"))
    with pytest.raises(FailedPrecondition) as err:
        await iris_client.launch_job(bash_spec(iris_job_name("s"), "true", resources=gpu, env={"T": sentinel}))
    assert sentinel not in str(err.value) and sentinel not in repr(err.value)


async def test_freshness_gate_is_on(iris_controller, iris_job_name):
    from iris.version import client_revision_date  # 0.2.227 measures the gate from its own build date

    old = (datetime.date.fromisoformat(client_revision_date()) - datetime.timedelta(days=15)).isoformat()
    async with IrisClient(iris_controller.url, client_revision_date=old, cluster_name="local") as client:
        with pytest.raises(ClientTooOld) as err:
            await client.launch_job(bash_spec(iris_job_name("old"), "true"))
    from clients.iris_pin import IRIS_VERSION

    msg = err.value.message
    assert old in msg and "clusters.local.client_revision_date (a configured override" in msg
    assert IRIS_VERSION in msg and "docs/iris-upgrade.md" in msg and "too old" in msg
    # Unset, the client sends its own marin-iris build date, which this controller accepts.
    async with IrisClient(iris_controller.url, cluster_name="local") as client:
        await client.launch_job(bash_spec(iris_job_name("fresh"), "true"))
    async with IrisClient(iris_controller.url, client_revision_date="not-a-date") as client:
        with pytest.raises(InvalidArgument):
            await client.launch_job(bash_spec(iris_job_name("bad"), "true"))


async def test_list_jobs_filters_by_state_and_prefix(iris_client, iris_job_name):
    base = iris_job_name("list")
    names = [f"{base}-{i}" for i in range(3)]
    for n in names:
        await iris_client.launch_job(bash_spec(n, "true"))
    for n in names:
        await wait_terminal(iris_client, n)
    jobs = await iris_client.list_jobs(prefix=base, state="succeeded")
    assert sorted(j.job_id for j in jobs) == names
    assert await iris_client.list_jobs(prefix=base, state="running") == []
    assert len(await iris_client.list_jobs(prefix=base, limit=2)) == 2
