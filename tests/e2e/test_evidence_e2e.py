"""Evidence outlives the worker: a failed build's log is read from the evidence store by
``starter.py logs``/``evidence`` after the worker that wrote it was stopped and its local state
(the work dir: mirrors, worktrees, bundles) was removed.

Real processes: a worker subprocess, the starter as a subprocess, the session's Temporal and Iris."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from temporalio.client import WorkflowFailureError

from sandbox.git_remotes import commit_to_remote
from tests.cli.starter_cli import starter
from tests.e2e.helpers import git_show, request, start_pipeline, stop_process, worker_process

pytestmark = pytest.mark.stack
DOCKERFILE = "docker/Dockerfile.gpu-rl"


async def test_logs_print_the_failing_line_after_the_worker_and_its_disk_are_gone(service_config):
    s = service_config
    text = git_show(s.remotes.marinskyrl_url, "main", DOCKERFILE)
    broken = text.replace("RUN echo \"boto3 s3 client ctor OK",
                          "RUN echo 'datasets import failed' >&2 && exit 3\nRUN echo \"boto3 s3 client ctor OK", 1)
    assert broken != text
    commit_to_remote(s.remotes.marinskyrl_url, {DOCKERFILE: broken}, "break a build step")
    worker = worker_process(s.config_path, s.state_dir / "worker.log")
    try:
        handle = await start_pipeline(s, request())
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()
    finally:
        assert stop_process(worker) == 0
    message = str(failed.value.cause)
    work_dir = Path(s.config.work_dir)
    assert any(work_dir.rglob("*")), "the worker left local state to remove"
    shutil.rmtree(work_dir)

    ran = await starter(s.config_path, "logs", handle.id)
    assert ran.code == 0, ran.text
    (marked,) = [line for line in ran.out.splitlines() if line.startswith(">")]
    assert "datasets import failed" in marked  # the cause, not kaniko's wrapper line below it
    assert "exit status 3" in ran.out  # the lines around it
    assert ran.out.startswith("== amd64-standard") and "assertion_failure" in ran.out
    store = s.config.evidence_url()
    assert f"file://{store}/" in ran.out and str(work_dir) not in ran.out
    # The failure summary quotes the same line, and points at the store, not at the worker's disk.
    assert "failing line:" in message and "datasets import failed" in message and f"file://{store}/" in message
    assert f"starter.py logs {handle.id} amd64-standard" in message

    one = await starter(s.config_path, "logs", handle.id, "amd64-standard")
    assert one.code == 0 and one.out == ran.out
    unknown = await starter(s.config_path, "logs", handle.id, "riscv64-standard")
    assert unknown.code == 2 and "riscv64-standard" in unknown.err and "amd64-standard" in unknown.err

    listed = await starter(s.config_path, "evidence", handle.id, "--json")
    assert listed.code == 0, listed.text
    rows = json.loads(listed.out)
    assert {r["kind"] for r in rows} == {"failure log", "diagnostics"}
    assert all(r["uri"].startswith(f"file://{store}/") and len(r["sha256"]) == 64 for r in rows)
    dest = s.state_dir / "downloaded"
    got = await starter(s.config_path, "evidence", handle.id, "--download", str(dest))
    assert got.code == 0, got.text
    files = sorted(Path(p) for p in got.out.split())
    assert len(files) == len(rows)
    by_name = {r["uri"].rsplit("/", 1)[-1]: r for r in rows}
    for f in files:
        assert hashlib.sha256(f.read_bytes()).hexdigest() == by_name[f.name]["sha256"]
    diag = json.loads(next(f for f in files if f.name.endswith(".diagnostics.json")).read_text())
    assert diag["failing_line"] == "datasets import failed"


async def test_logs_for_an_unknown_workflow_is_bad_input(service_config):
    ran = await starter(service_config.config_path, "logs", "gpu-rl-build-000000000000-000000000000")
    assert ran.code == 2 and "no such workflow" in ran.err and "Traceback" not in ran.text
