"""Durability: the worker is SIGKILLed in the middle of a build and another worker finishes it.

Real processes (two worker subprocesses), real Temporal, real Iris: the build completes with exactly
one Iris job (the re-run submit attaches), and neither worker's log holds a secret. SIGTERM on the
second worker drains and exits 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from clients.iris import IrisClient
from domain.models import target_workflow_id
from sandbox.git_remotes import commit_to_remote
from tests.e2e.helpers import held_until, request, start_pipeline, target_status, wait_until, worker_started
from workflows.target import TargetBuildWorkflow

pytestmark = pytest.mark.stack
ROOT = Path(__file__).resolve().parents[2]


def _worker(config: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(ROOT / "worker.py"), "--config", str(config), "--graceful-shutdown", "5"],
                            cwd=ROOT, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)


async def test_build_survives_worker_sigkill(service_config):
    s = service_config
    logs = [s.state_dir / "worker-1.log", s.state_dir / "worker-2.log"]
    # A build that takes a while, so the crash lands while the job runs.
    dockerfile = subprocess.run(["git", "--git-dir", s.remotes.marinskyrl_url.removeprefix("file://"), "show",
                                 "main:docker/Dockerfile.gpu-rl"], capture_output=True, text=True, check=True).stdout
    release = s.state_dir / "release-the-build-step"  # held until the second worker runs (bounded)
    slow = dockerfile.replace('RUN echo "boto3 s3 client ctor OK', f"RUN {held_until(release)}\n"
                              'RUN echo "boto3 s3 client ctor OK', 1)
    assert slow != dockerfile
    commit_to_remote(s.remotes.marinskyrl_url, {"docker/Dockerfile.gpu-rl": slow}, "a slow build step")
    first = _worker(s.config_path, logs[0])
    second = None
    try:
        handle = await start_pipeline(s, request())
        key = "amd64-standard"
        st = await wait_until(lambda: _running(s.client, handle.id, key), what="job running")
        os.killpg(first.pid, signal.SIGKILL)  # crash mid-monitoring: no graceful anything
        first.wait(timeout=10)
        second = _worker(s.config_path, logs[1])
        await wait_until(lambda: worker_started(logs[1]), what="the second worker polling")
        release.touch()
        await wait_until(lambda: _waiting(s.client, handle.id, key), timeout=300, what="visibility wait")
        s.token_registry.set_public(s.image_repo_path, True)
        await s.client.get_workflow_handle(target_workflow_id(handle.id, key)).signal(TargetBuildWorkflow.recheck)
        rep = await wait_until(lambda: _awaiting_merge(s.client, handle.id), timeout=300, what="PR opened")
        t = rep.targets[0]
        assert t.status == "validated" and t.job_ids == st.job_ids
        async with IrisClient(s.iris.url, client_revision_date=s.config.clusters["sandbox-amd64"].client_revision_date) as iris:
            jobs = await iris.list_jobs(prefix=t.job_ids[0])
        assert [j.job_id for j in jobs] == t.job_ids  # the new worker attached; nothing was resubmitted
        await handle.cancel()
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=60) == 0
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    text = "".join(log.read_text(errors="replace") for log in logs)
    assert "worker started" in text
    for secret in (s.token_registry.push_token, s.github.token):
        assert secret not in text


async def _running(client, wid, key):
    st = await target_status(client, wid, key)
    return st if st and st.progress and st.progress.state == "running" else None


async def _waiting(client, wid, key):
    st = await target_status(client, wid, key)
    return st if st and st.waiting else None


async def _awaiting_merge(client, wid):
    from tests.e2e.helpers import report

    rep = await report(client, wid)
    return rep if rep.pull_request else None
