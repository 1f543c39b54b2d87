"""IrisClient pieces that the local controller cannot exercise: spec validation, wire encoding,
lenient parsing, error mapping for 429/503/transport, bounded retries, port-forward argv."""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from clients.iris import (
    AlreadyExists,
    GpuRequest,
    Internal,
    IrisClient,
    JobInfo,
    JobState,
    LaunchSpec,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Resources,
    TaskInfo,
    TaskState,
    Unavailable,
)
from clients.kube import KubectlPortForward
from tests.standins import KUBECTL_STANDIN, configured_kubectl

STANDIN = str(KUBECTL_STANDIN)


@pytest.mark.parametrize("name", ["badname", "/onlyuser", "user/job", "/u/", "/u/j b", "//j"])
def test_launch_spec_rejects_bad_names(name):
    with pytest.raises(ValidationError):
        LaunchSpec(name=name, argv=["true"])


def test_launch_spec_wire_and_repr_hide_env():
    spec = LaunchSpec(name="/u/build-1", argv=["bash", "-c", "x"], env={"TOKEN": "s3cret-value"},
                      bundle_blob=b"zipbytes", resources=Resources(cpu_millicores=48000, gpu=GpuRequest(variant="GB200")),
                      timeout_s=18000, scheduling_timeout_s=3.5, priority_band="interactive",
                      task_image="docker.io/library/ubuntu:22.04", max_retries_preemption=3)
    assert "s3cret-value" not in repr(spec) and "zipbytes" not in repr(spec)
    wire = spec.to_wire("2026-11-20")
    assert wire["environment"] == {"envVars": {"TOKEN": "s3cret-value"}}
    assert wire["existingJobPolicy"] == "EXISTING_JOB_POLICY_KEEP"
    assert wire["clientRevisionDate"] == "2026-11-20"
    assert wire["timeout"] == {"milliseconds": "18000000"} and wire["schedulingTimeout"] == {"milliseconds": "3500"}
    assert wire["resources"]["device"] == {"gpu": {"variant": "GB200", "count": 1}}
    assert wire["priorityBand"] == "PRIORITY_BAND_INTERACTIVE" and wire["replicas"] == 1
    assert "setupCommands" not in json.dumps(wire)
    assert wire["bundleBlob"] == "emlwYnl0ZXM="


def test_lenient_parsing():
    info = JobInfo.from_wire({"job_id": "/u/j", "state": 5, "failureCount": "2", "finishedAt": {"epoch_ms": "17"},
                              "newField": {"x": 1}}, [
        TaskInfo.from_wire({"taskId": "/u/j/0", "state": "TASK_STATE_FAILED", "exitCode": 9,
                            "attempts": [{"attemptId": 0, "state": "TASK_STATE_FAILED", "exitCode": "9",
                                          "podName": "iris-u-j-0-abc-0"}]}),
        TaskInfo.from_wire({"taskId": "/u/j/1", "state": "TASK_STATE_RUNNING"})])
    assert info.state is JobState.FAILED and info.is_terminal and info.failure_count == 2
    assert info.finished_at_ms == 17 and info.exit_code == 9
    assert info.tasks[1].exit_code is None and info.tasks[0].attempts[0].pod_name == "iris-u-j-0-abc-0"
    assert JobState.parse("JOB_STATE_SOMETHING_NEW") is JobState.UNSPECIFIED
    assert TaskState.parse("TASK_STATE_PREEMPTED").is_terminal


def _client(handler, **kw) -> IrisClient:
    c = IrisClient("http://iris.invalid", client_revision_date="2026-11-20", backoff_s=0.001, **kw)
    c._http = httpx.AsyncClient(base_url="http://iris.invalid", transport=httpx.MockTransport(handler))
    return c


@pytest.mark.parametrize("status,code,exc", [
    (404, "not_found", NotFound), (409, "already_exists", AlreadyExists), (403, "permission_denied", PermissionDenied),
    (429, "resource_exhausted", ResourceExhausted), (503, "unavailable", Unavailable), (500, "internal", Internal),
])
async def test_error_mapping_and_bounded_retry(status, code, exc):
    calls = []

    def handler(request):
        calls.append(request.url.path)
        return httpx.Response(status, json={"code": code, "message": "nope"})

    client = _client(handler, max_attempts=3)
    with pytest.raises(exc):
        await client.job_states(["/u/j"])
    assert len(calls) == (3 if exc.transient else 1)


async def test_transport_error_is_unavailable_and_launch_is_never_retried():
    calls = []

    def handler(request):
        calls.append(request.url.path)
        raise httpx.ConnectError("refused")

    client = _client(handler, max_attempts=3)
    with pytest.raises(Unavailable):
        await client.launch_job(LaunchSpec(name="/u/j", argv=["true"]))
    assert calls == ["/iris.cluster.ControllerService/LaunchJob"]


async def test_transient_then_success():
    replies = [httpx.Response(503, text="upstream down"), httpx.Response(200, json={"states": {"/u/j": "JOB_STATE_RUNNING"}})]
    client = _client(lambda r: replies.pop(0))
    assert await client.job_states(["/u/j"]) == {"/u/j": JobState.RUNNING}


async def test_submit_idempotent_looks_up_after_lost_launch_reply():
    seen = []

    def handler(request):
        method = request.url.path.rsplit("/", 1)[1]
        seen.append(method)
        if method == "GetJobStatus" and "LaunchJob" not in seen:
            return httpx.Response(404, json={"code": "not_found", "message": "Job /u/j not found"})
        if method == "LaunchJob":
            raise httpx.ReadTimeout("lost reply")
        return httpx.Response(200, json={"job": {"jobId": "/u/j", "state": "JOB_STATE_PENDING"},
                                         "request": {"environment": {"envVars": {"T": "x"}}}})

    client = _client(handler)
    assert await client.submit_idempotent(LaunchSpec(name="/u/j", argv=["true"], env={"T": "x"})) == ("/u/j", False)
    assert seen == ["GetJobStatus", "LaunchJob", "GetJobStatus"]


async def test_error_message_never_echoes_env_or_token():
    secret, token = "hunter2-secret", "tok-abcdef"

    def handler(request):
        assert request.headers["authorization"] == f"Bearer {token}"
        return httpx.Response(400, json={"code": "invalid_argument", "message": f"bad env T={secret}"})

    client = _client(handler, token=token)
    client._http.headers["Authorization"] = f"Bearer {token}"
    with pytest.raises(Exception) as err:
        await client.launch_job(LaunchSpec(name="/u/j", argv=["true"], env={"T": secret}))
    assert secret not in str(err.value) and token not in str(err.value) and token not in repr(client)


async def test_arch_hint_from_worker_attributes():
    workers = {"workers": [{"metadata": {"attributes": {"arch": {"stringValue": "aarch64"}}}},
                           {"metadata": {"attributes": {"kubernetes.io/arch": {"stringValue": "arm64"}}}}]}
    assert await _client(lambda r: httpx.Response(200, json=workers)).cluster_arch_hint() == "arm64"
    workers["workers"].append({"metadata": {"attributes": {}}})
    assert await _client(lambda r: httpx.Response(200, json=workers)).cluster_arch_hint() is None


def test_port_forward_argv():
    pf = KubectlPortForward("~/.kube/coreweave-iris", "cw-us-east-08a")
    assert pf.argv(43210) == ["kubectl", "--kubeconfig", str(Path("~/.kube/coreweave-iris").expanduser()),
                              "--context", "cw-us-east-08a", "--namespace", "iris", "port-forward",
                              "--address", "127.0.0.1", "svc/iris-controller-svc", "43210:10000"]
    assert KubectlPortForward(None, None, "ns", "svc2", 8080, kubectl="/k").argv(1) == [
        "/k", "--namespace", "ns", "port-forward", "--address", "127.0.0.1", "svc/svc2", "1:8080"]


@pytest.mark.stack
async def test_port_forward_through_standin_to_real_controller(iris_controller, tmp_path):
    kubectl = configured_kubectl(tmp_path / "kubectl", KUBECTL_STANDIN_FORWARD_TO=f"127.0.0.1:{iris_controller.port}")
    pf = KubectlPortForward(None, None, kubectl=kubectl, ready_timeout_s=20)
    async with pf as url:
        assert url.startswith("http://127.0.0.1:") and url != iris_controller.url
        async with IrisClient(url, client_revision_date=datetime.date.today().isoformat()) as client:
            assert await client.health()
            assert await client.list_tasks("/tester/nothing-here") == []
        pid = pf._proc.pid
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_port_forward_failure_is_unavailable(tmp_path):
    pf = KubectlPortForward(str(tmp_path / "missing-kubeconfig"), None, kubectl=STANDIN, ready_timeout_s=20)
    with pytest.raises(Unavailable, match="no such file"):
        async with pf:
            pass


async def test_requests_are_marin_iris_messages():
    """Every body is the JSON of the RPC's own request message (clients/iris.py builds them from the pb2
    classes): LaunchJob parses back into LaunchJobRequest with nothing unknown."""
    from google.protobuf import json_format
    from iris.rpc import controller_pb2, job_pb2

    bodies = {}

    def handler(request):
        bodies[request.url.path.rsplit("/", 1)[1]] = json.loads(request.content)
        return httpx.Response(200, json={"jobId": "/u/j"})

    spec = LaunchSpec(name="/u/j", argv=["true"], priority_band="interactive", resources=Resources(memory_bytes=3 << 30))
    assert await _client(handler).launch_job(spec) == "/u/j"
    req = json_format.ParseDict(bodies["LaunchJob"], controller_pb2.Controller.LaunchJobRequest())
    assert req.priority_band == job_pb2.PRIORITY_BAND_INTERACTIVE and req.resources.memory_bytes == 3 << 30
    assert bodies["LaunchJob"]["resources"]["memoryBytes"] == str(3 << 30)  # int64 as a JSON string


async def test_a_reply_with_what_this_marin_iris_does_not_know_is_parsed_and_recorded_as_drift(caplog):
    reply = {"jobs": [{"jobId": "/u/j", "state": "JOB_STATE_RUNNING", "newerField": 1}], "hasMore": False}
    client = _client(lambda r: httpx.Response(200, json=reply))
    with caplog.at_level("WARNING", logger="clients.iris"):
        [job] = await client.list_jobs()
        await client.list_jobs()
    assert job.state is JobState.RUNNING and job.job_id == "/u/j"
    [(key, count)] = client.drift.items()
    assert key.startswith("ListJobs: ") and '"newerField"' in key and count == 2
    assert len([r for r in caplog.records if "newerField" in r.getMessage()]) == 1  # logged once


async def test_an_unknown_job_state_is_never_read_as_a_known_one():
    """GetJobState leaves such a job out (the caller confirms it with GetJobStatus, as for any absent id);
    GetJobStatus gives UNSPECIFIED, which no caller takes for an end. Both are recorded as drift."""
    client = _client(lambda r: httpx.Response(200, json={"states": {"/u/j": "JOB_STATE_PAUSED"}}))
    assert await client.job_states(["/u/j"]) == {}
    client = _client(lambda r: httpx.Response(200, json={"job": {"jobId": "/u/j", "state": "JOB_STATE_PAUSED"}}))
    assert (await client.job_status("/u/j", with_tasks=False)).state is JobState.UNSPECIFIED
    assert any("Invalid enum value JOB_STATE_PAUSED" in k for k in client.drift)


async def test_a_changed_scalar_type_fails_the_call_naming_the_field():
    client = _client(lambda r: httpx.Response(200, json={"tasks": [{"taskId": "/u/j/0", "exitCode": "seven"}]}))
    with pytest.raises(Internal, match=r"ListTasksResponse.*exitCode"):
        await client.list_tasks("/u/j")


async def test_the_launch_request_echo_is_dropped_before_parsing():
    """GetJobStatus echoes the launch request with its env: never parsed, so never in drift or an error."""
    secret = "s3cret-env-value"
    reply = {"job": {"jobId": "/u/j", "state": "JOB_STATE_PENDING"},
             "request": {"environment": {"envVars": {"T": secret}}, "unknownEcho": secret, "replicas": secret}}
    client = _client(lambda r: httpx.Response(200, json=reply))
    info = await client.job_status("/u/j", with_tasks=False)
    assert info.state is JobState.PENDING and not client.drift and secret not in repr(info)
