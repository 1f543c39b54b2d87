"""The end phase reads a terminal job's log once (issue 37 item 3), on the real 0.2.227 controller.

A succeeded job whose log lacks a marker needs the pushed image to stand in; with the registry giving no
verdict (nothing listens at its address) ``check_build_log`` raises Transient and Temporal retries it.
Before, every attempt read the whole log from the start again (240-2,076 ``FetchLogs`` a minute per cluster
at 200 targets); now the first attempt reads it and verifies its gaps, and a retry sends no log request."""

from __future__ import annotations

import asyncio
import datetime
import socket
import uuid
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from activities.build import BuildActivities
from activities.errors import Transient
from clients.iris import IrisClient
from domain.config import ServiceConfig
from domain.markers import Marker
from domain.models import LogCheckInput
from tests.iris.helpers import bash_spec
from tests.workflows.standins import target_input

pytestmark = pytest.mark.stack

ARCH_LINE = "[arch] build host=x86_64"


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _config(tmp_path: Path, url: str, registry_host: str) -> ServiceConfig:
    return ServiceConfig.model_validate({
        "work_dir": str(tmp_path / "work"),
        "repos": {"marinskyrl_url": "file:///nowhere", "harbor_url": "file:///nowhere"},
        "clusters": {"local": {"controller_url": url, "iris_user": "tester",
                               "client_revision_date": datetime.date.today().isoformat()}},
        "registry": {"image_repository": f"{registry_host}/evidence", "insecure_hosts": [registry_host],
                     "user": {"kind": "literal_public", "value": "u"}, "token": {"kind": "env", "name": "NO_SUCH_X"}},
    })


async def test_a_retried_log_check_sends_no_log_request(iris_controller, iris_client, tmp_path, monkeypatch):
    host = f"127.0.0.1:{_closed_port()}"  # the registry: nothing answers, so no verdict on the image
    acts = BuildActivities(_config(tmp_path, iris_controller.url, host))
    repo, tag = f"{host}/evidence", "t1"
    target = target_input("read-once").target.model_copy(update={
        "expected_markers": [Marker(name=ARCH_LINE, text=ARCH_LINE, source="script", image_proof="script"),
                             Marker(name=f"push {repo}:{tag}", text=f"Pushing image to {repo}:{tag}", source="kaniko",
                                    role="push")],
        "image_repository": repo, "tag": tag})
    name = f"/tester/read-once-{uuid.uuid4().hex[:8]}"
    # The arch line is missing: only the image could prove it, and the registry gives no verdict.
    await iris_client.launch_job(bash_spec(name, f"seq 1 300; echo 'Pushing image to {repo}:{tag}'"))
    for _ in range(2400):
        state = (await iris_client.job_states([name])).get(name)
        if state and state.is_terminal:
            break
        await asyncio.sleep(0.05)
    assert state and state.value == "succeeded", state

    calls: list[str] = []
    real = IrisClient.fetch_logs

    async def counted(self, source, *args, **kwargs):
        calls.append(source)
        return await real(self, source, *args, **kwargs)
    monkeypatch.setattr(IrisClient, "fetch_logs", counted)
    inp = LogCheckInput(request_id="read-once", job_id=name, cluster="local", target=target, build_commit="1" * 40,
                        harbor_commit="2" * 40)
    per_attempt = []
    for _ in range(3):
        before = len(calls)
        with pytest.raises(Transient, match="no verdict"):
            await ActivityEnvironment().run(acts.check_build_log, inp)
        per_attempt.append(len(calls) - before)
    assert per_attempt[0] >= 1, per_attempt  # the first attempt read the log
    assert per_attempt[1:] == [0, 0], per_attempt  # the retries read nothing again
    saved = acts.log_reads.load(name)
    assert saved is not None and saved.log.complete and saved.requests == per_attempt[0]
    assert any("Pushing image to" in e.data for e in saved.log.entries)
