"""Redaction by construction: a build prints its environment (the registry token among it), the worker
that submitted it is SIGKILLed mid-job, and a new worker process — which never fetched that token for
the job — captures the failure. The token appears in no evidence file, no history and no worker log."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from domain.models import Stage
from sandbox.git_remotes import commit_to_remote
from tests.e2e.helpers import (
    git_show,
    held_until,
    in_the_real_job_only,
    is_closed,
    request,
    start_pipeline,
    target_status,
    wait_until,
    worker_started,
)
from tests.e2e.test_worker_crash_e2e import _worker

pytestmark = pytest.mark.stack
SCRIPT = "docker/build_gpu_rl_kaniko.sh"
KEY = "amd64-standard"


async def test_evidence_written_after_a_worker_crash_is_redacted(service_config):
    s = service_config
    sentinel = s.token_registry.push_token
    script = git_show(s.remotes.marinskyrl_url, "main", SCRIPT)
    release = s.state_dir / "release-the-job"  # the job holds until worker 2 runs (bounded), then leaks and fails
    leaky = script.replace("unset GHCR_TOKEN\n", in_the_real_job_only(
        f'{held_until(release)}\nenv | sed "s/=/ is /"\necho "token in a sentence: $GHCR_TOKEN" >&2\nexit 3')
        + "unset GHCR_TOKEN\n", 1)
    assert leaky != script
    commit_to_remote(s.remotes.marinskyrl_url, {SCRIPT: leaky}, "a build that prints its environment, then fails")
    logs = [s.state_dir / "worker-1.log", s.state_dir / "worker-2.log"]
    first = _worker(s.config_path, logs[0])
    second = None
    try:
        handle = await start_pipeline(s, request())
        await wait_until(lambda: _running(s, handle.id), timeout=300, what="job running")
        os.killpg(first.pid, signal.SIGKILL)  # the worker that submitted the job (and fetched the token) dies
        first.wait(timeout=10)
        second = _worker(s.config_path, logs[1])
        await wait_until(lambda: worker_started(logs[1]), what="worker 2 polling")
        release.touch()
        st = await wait_until(lambda: _captured(s, handle.id), timeout=300, what="failure captured by worker 2")
        assert st.failure_class
        await handle.cancel()
        await wait_until(lambda: is_closed(s.client, handle.id), timeout=120, what="pipeline closed")
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=60) == 0
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)

    evidence = [p for p in Path(s.config.evidence_url()).rglob("*") if p.is_file()]
    assert any(p.name.endswith(".diagnostics.json") for p in evidence) and any(p.suffix == ".log" for p in evidence)
    log_text = "".join(p.read_text(errors="replace") for p in evidence if p.suffix == ".log")
    assert "token in a sentence: [REDACTED]" in log_text  # printed, and redacted by the new worker
    leaks = [str(p) for p in evidence if sentinel in p.read_text(errors="replace")]
    histories = []
    for wid in (handle.id, f"{handle.id}/{KEY}"):
        histories.append(json.dumps((await s.client.get_workflow_handle(wid).fetch_history()).to_json_dict()))
    leaks += [f"history {i}" for i, h in enumerate(histories) if sentinel in h]
    leaks += [str(p) for p in logs if sentinel in p.read_text(errors="replace")]
    assert leaks == []
    assert "[REDACTED]" in histories[1] or "token in a sentence" not in histories[1]


async def _running(s, wid):
    st = await target_status(s.client, wid, KEY)
    return st if st and st.progress and st.progress.state == "running" else None


async def _captured(s, wid):
    st = await target_status(s.client, wid, KEY)
    return st if st and st.stage in (Stage.WAITING, Stage.FAILED) and st.failure_class else None
