"""clients/iris.py follows the installed marin-iris protos; the drift test fails on a modified copy.

The engine is tests/contract/iris_surface.py (the client driven through every call; requests parsed by
protobuf's JSON parser, reply reads recorded). Here: it agrees with the installed protos, and each
kind of upstream change — a renamed RPC, a renamed request field, a renamed reply field, a new job
state, a moved log service — is reported by name."""

from __future__ import annotations

import re

import pytest

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


def test_drift_renamed_request_field_is_reported():
    problems = iris_surface.check(_modified(_rename_field(
        "iris.cluster", "Controller.LaunchJobRequest", "max_task_failures", "max_failed_tasks")))
    assert any("LaunchJob request" in p and "maxTaskFailures" in p for p in problems), problems


def test_drift_renamed_reply_field_is_reported():
    problems = iris_surface.check(_modified(_rename_field("iris.job", "JobStatus", "failure_count", "failures")))
    assert any("reads 'failureCount' of iris.job.JobStatus" in p for p in problems), problems


def test_drift_renamed_log_entry_field_is_reported():
    problems = iris_surface.check(_modified(_rename_field("finelog.logging", "LogEntry", "data", "line")))
    assert any("reads 'data' of finelog.logging.LogEntry" in p for p in problems), problems


def test_drift_new_job_state_is_reported():
    def edit(f) -> None:
        for enum in f.enum_type:
            if f.package == "iris.job" and enum.name == "JobState":
                enum.value.add(name="JOB_STATE_PAUSED", number=99)
    problems = iris_surface.check(_modified(edit))
    assert any("iris.job.JobState" in p and "paused" in p for p in problems), problems


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
