"""Failure paths on real parts: a broken build step and a contract the request cannot satisfy.

A failed assertion is captured (summary, attempts, full log → one diagnostics file), classified and
never retried, and nothing is recorded. A bad contract is refused before anything is submitted or
pushed: no Iris job, no build branch, no PR."""

from __future__ import annotations

import json
import subprocess

import pytest
from temporalio.client import WorkflowFailureError

from clients.evidence import read_evidence
from clients.iris import IrisClient
from domain.models import FileRef
from runtime import search_attributes as sa
from sandbox.git_remotes import commit_to_remote
from tests.e2e.helpers import git_show, report, request, start_pipeline

pytestmark = pytest.mark.stack

DOCKERFILE = "docker/Dockerfile.gpu-rl"


def _branches(url: str) -> list[str]:
    out = subprocess.run(["git", "--git-dir", url.removeprefix("file://"), "branch", "--format=%(refname:short)"],
                         capture_output=True, text=True, check=True).stdout
    return out.split()


async def _iris_jobs(stack, sha: str) -> list:
    async with IrisClient(stack.iris.url, client_revision_date=stack.config.clusters["sandbox-amd64"].client_revision_date) as iris:
        return [j for j in await iris.list_jobs(prefix="/gpu-rl-builder/") if f"-{sha[:8]}" in j.job_id]


async def test_failed_build_step_is_captured_classified_and_not_retried(service_stack):
    s = service_stack
    text = git_show(s.remotes.marinskyrl_url, "main", DOCKERFILE)
    broken = text.replace("RUN echo \"boto3 s3 client ctor OK",
                          "RUN echo 'datasets import failed' >&2 && exit 3\nRUN echo \"boto3 s3 client ctor OK", 1)
    assert broken != text
    commit_to_remote(s.remotes.marinskyrl_url, {DOCKERFILE: broken}, "break a build step")
    handle = await start_pipeline(s, request())
    with pytest.raises(WorkflowFailureError) as failed:
        await handle.result()
    message = str(failed.value.cause)
    assert "assertion_failure" in message and "diagnostics.json" in message and "next step" in message

    rep = await report(s.client, handle.id)
    (t,) = rep.targets
    assert t.status == "failed" and len(t.job_ids) == 1  # never retried
    (f,) = t.failures
    assert f.failure_class == "assertion_failure" and f.decision == "fail"
    diag = json.loads(read_evidence(f.diagnostics))
    assert diag["summary"]["state"] == "failed" and diag["tasks"][0]["attempts"]
    log = read_evidence(FileRef.model_validate(diag["log"])).decode()
    assert "datasets import failed" in log and "exit status 3" in log
    assert f.log == FileRef.model_validate(diag["log"]) and f.failing_line == "datasets import failed"
    assert f"failing line: {f.failing_line!r}" in message
    assert rep.pull_request is None  # nothing recorded for a failed build
    child = await s.client.get_workflow_handle(f"{handle.id}/amd64-standard").describe()
    assert child.typed_search_attributes.get(sa.FAILURE_CLASS) == "assertion_failure"
    assert child.typed_search_attributes.get(sa.STAGE) == "failed"


async def test_unsatisfiable_contract_is_refused_before_anything_is_submitted_or_pushed(service_stack):
    s = service_stack
    script = git_show(s.remotes.marinskyrl_url, "main", "docker/build_gpu_rl_kaniko.sh")
    marker = ': "${GITSHA:?'
    assert marker in script
    changed = script.replace(marker, ': "${SIGNING_KEY_ID:?set SIGNING_KEY_ID to the cosign key id}"\n' + marker, 1)
    head = commit_to_remote(s.remotes.marinskyrl_url, {"docker/build_gpu_rl_kaniko.sh": changed},
                            "script now requires SIGNING_KEY_ID")
    branches_before = _branches(s.remotes.marinskyrl_url)
    handle = await start_pipeline(s, request())
    with pytest.raises(WorkflowFailureError) as failed:
        await handle.result()
    message = str(failed.value.cause)  # the pipeline's own failure names the real cause
    assert "SIGNING_KEY_ID" in message and "build_gpu_rl_kaniko.sh" in message
    rep = await report(s.client, handle.id)
    assert rep.targets == []
    assert _branches(s.remotes.marinskyrl_url) == branches_before  # no stray build branch
    assert await _iris_jobs(s, head) == [] and (rep.source is None or await _iris_jobs(s, rep.source.build_commit) == [])


async def test_placement_on_an_unconfigured_cluster_is_refused_before_submit(service_stack):
    s = service_stack
    req = request()
    req = req.model_copy(update={"clusters": {}})  # ops placements say cw-rno2a, which is not configured
    branches_before = _branches(s.remotes.marinskyrl_url)
    handle = await start_pipeline(s, req)
    with pytest.raises(WorkflowFailureError) as failed:
        await handle.result()
    message = str(failed.value.cause)
    assert "cw-rno2a" in message and "not configured" in message and "--cluster" in message
    assert _branches(s.remotes.marinskyrl_url) == branches_before
