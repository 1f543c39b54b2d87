"""clients/iris.py follows the installed marin-iris protos; the drift test fails on a modified copy.

The engine is tests/contract/iris_surface.py (the client, which speaks marin-iris's generated messages,
driven through every call with every enum value it sends, against replies of the modified protos in every
job and task state; every request and reply walked against both sets of descriptors). Here: it agrees
with the installed protos, and each kind of upstream change — a renamed RPC, a renamed or removed field, a
removed or added enum value, a changed scalar type, a moved log service — is reported by name, and where
it was seen: terminal replies, non-terminal replies, requests."""

from __future__ import annotations

import re

import pytest
from google.protobuf.descriptor_pb2 import FieldDescriptorProto

from tests.contract import iris_surface

pytest.importorskip("iris.rpc.controller_pb2")


def _camel(name: str) -> str:
    return re.sub(r"_([a-z0-9])", lambda m: m.group(1).upper(), name)


def _modified(edit) -> object:
    files = iris_surface.installed_files()
    for f in files:
        edit(f)
    return iris_surface.pool_of(files)


def _message(f, dotted: str):
    """The DescriptorProto named ``Outer.Inner`` inside file ``f`` (None if not there)."""
    parts = dotted.split(".")
    scope = f.message_type
    msg = None
    for part in parts:
        msg = next((m for m in scope if m.name == part), None)
        if msg is None:
            return None
        scope = msg.nested_type
    return msg


def _rename_field(package: str, message: str, old: str, new: str):
    def edit(f) -> None:
        if f.package != package or (msg := _message(f, message)) is None:
            return
        (field,) = [x for x in msg.field if x.name == old]
        field.name, field.json_name = new, _camel(new)
    return edit


def test_the_client_agrees_with_the_installed_protos():
    assert iris_surface.check(iris_surface.installed_pool()) == []


def test_drift_renamed_rpc_is_reported():
    def edit(f) -> None:
        for service in f.service:
            for method in service.method:
                if (f.package, service.name, method.name) == ("finelog.logging", "LogService", "FetchLogs"):
                    method.name = "FetchLogRows"
    problems = iris_surface.check(_modified(edit))
    assert any("finelog.logging.LogService has no RPC FetchLogs" in p and "FetchLogRows" in p for p in problems), problems


def _one(problems: list[str], *needles: str) -> str:
    found = [p for p in problems if all(n in p for n in needles)]
    assert found, "\n".join(problems)
    return found[0]


def _seen(line: str) -> set[str]:
    return set(line.rsplit("[seen in ", 1)[1].rstrip("]").split(", "))


def _retype(package: str, message: str, name: str, new_type: int):
    def edit(f) -> None:
        if f.package == package and (msg := _message(f, message)) is not None:
            (field,) = [x for x in msg.field if x.name == name]
            field.type = new_type
    return edit


def _remove_enum_value(package: str, enum_name: str, value: str):
    def edit(f) -> None:
        if f.package != package:
            return
        enums = list(f.enum_type) + [e for m in f.message_type for e in m.enum_type]
        for enum in enums:
            if enum.name == enum_name:
                (v,) = [x for x in enum.value if x.name == value]
                enum.value.remove(v)
    return edit


def test_drift_renamed_request_field_is_reported():
    problems = iris_surface.check(_modified(_rename_field(
        "iris.cluster", "Controller.LaunchJobRequest", "max_task_failures", "max_failed_tasks")))
    line = _one(problems, "renamed or removed field: the client sends", "LaunchJobRequest.max_task_failures",
                "'max_failed_tasks' there: renamed")
    assert _seen(line) == {"requests"}
    _one(problems, "LaunchJob request", "refused by the controller's parser", "maxTaskFailures")


@pytest.mark.parametrize("message", ["TaskStatus", "TaskAttempt"])
def test_drift_renamed_exit_code_is_reported_in_terminal_replies(message):
    """A controller sets exit codes only once a task or attempt ended: the rename shows in terminal
    replies alone (the old harness, which filled every state with its first value, missed both)."""
    problems = iris_surface.check(_modified(_rename_field("iris.job", message, "exit_code", "exit_status")))
    line = _one(problems, "renamed or removed field: the controller sends", f"iris.job.{message}.exit_status",
                "'exit_code' there: renamed")
    assert _seen(line) == {"terminal replies"}
    _one(problems, "IrisClient.drift", f'"iris.job.{message}" has no field named "exitStatus"')


def test_drift_renamed_reply_field_is_reported_in_terminal_and_non_terminal_replies():
    problems = iris_surface.check(_modified(_rename_field("iris.job", "JobStatus", "failure_count", "failures")))
    line = _one(problems, "iris.job.JobStatus.failures", "'failure_count' there: renamed")
    assert {"terminal replies", "non-terminal replies"} <= _seen(line)


def test_drift_renamed_log_entry_field_is_reported():
    problems = iris_surface.check(_modified(_rename_field("finelog.logging", "LogEntry", "data", "line")))
    _one(problems, "finelog.logging.LogEntry.line", "'data' there: renamed")


def test_drift_removed_priority_band_the_service_sends_is_reported():
    """Every real build sends PRIORITY_BAND_INTERACTIVE (the old harness drove ``batch`` only)."""
    problems = iris_surface.check(_modified(_remove_enum_value("iris.job", "PriorityBand",
                                                                "PRIORITY_BAND_INTERACTIVE")))
    _one(problems, "removed enum value: PRIORITY_BAND_INTERACTIVE of iris.job.PriorityBand")
    assert _seen(_one(problems, "enum value PRIORITY_BAND_INTERACTIVE", "not in the controller's protos",
                      "[seen")) == {"requests"}


@pytest.mark.parametrize("value", ["JOB_STATE_SUCCEEDED", "JOB_STATE_PENDING"])
def test_drift_removed_job_state_is_reported(value):
    """A terminal and a non-terminal state the client maps."""
    problems = iris_surface.check(_modified(_remove_enum_value("iris.job", "JobState", value)))
    _one(problems, "removed enum value", "iris.job.JobState", value)


def test_drift_new_job_state_is_reported():
    def edit(f) -> None:
        for enum in f.enum_type:
            if f.package == "iris.job" and enum.name == "JobState":
                enum.value.add(name="JOB_STATE_PAUSED", number=99)
    problems = iris_surface.check(_modified(edit))
    _one(problems, "iris.job.JobState", "JOB_STATE_PAUSED", "the client's JobState/TaskState does not")
    _one(problems, "IrisClient.drift", "Invalid enum value JOB_STATE_PAUSED")


@pytest.mark.parametrize("new_type,name", [(FieldDescriptorProto.TYPE_STRING, "string"),
                                           (FieldDescriptorProto.TYPE_DOUBLE, "double"),
                                           (FieldDescriptorProto.TYPE_INT32, "int32")])
def test_drift_changed_type_of_memory_bytes_is_reported(new_type, name):
    """The client sends memory_bytes in every LaunchJob and reads it back in job statuses; an int64's JSON
    string parses into a string field, so only the walk sees this one in requests."""
    problems = iris_surface.check(_modified(_retype("iris.job", "ResourceSpecProto", "memory_bytes", new_type)))
    line = _one(problems, "changed scalar type: iris.job.ResourceSpecProto.memory_bytes is int64 in the client's",
                f"{name} in the controller's")
    assert {"requests", "terminal replies", "non-terminal replies"} <= _seen(line)


def test_drift_changed_type_of_exit_code_is_reported_in_terminal_replies():
    problems = iris_surface.check(_modified(_retype("iris.job", "TaskStatus", "exit_code",
                                                    FieldDescriptorProto.TYPE_STRING)))
    line = _one(problems, "changed scalar type: iris.job.TaskStatus.exit_code is int32", "string in the controller's")
    assert _seen(line) == {"terminal replies"}
    _one(problems, "the client failed on a reply built from the protos", "exitCode")


def test_drift_log_service_moved_is_reported(monkeypatch):
    from clients import iris as client_mod

    monkeypatch.setattr(client_mod, "LOG_SERVER_PROXY_PREFIX", "")  # the pre-0.2.227 top-level path
    problems = iris_surface.check(iris_surface.installed_pool())
    assert any("log server proxy path" in p and "/proxy/system.log-server" in p for p in problems), problems


def test_pin_is_the_installed_marin_iris():
    """clients/iris_pin.py names the marin-iris the tests ran against; its date is what the CLI sends."""
    from importlib.metadata import version

    from iris import version as iris_version

    from clients.iris_pin import IRIS_REVISION_DATE, IRIS_VERSION

    assert IRIS_VERSION == version("marin-iris"), "update clients/iris_pin.py (docs/iris-upgrade.md)"
    assert IRIS_REVISION_DATE == (iris_version.BUILD_DATE or iris_version.client_revision_date())
