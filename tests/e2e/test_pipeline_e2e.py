"""The whole runbook on real parts: Temporal dev server, Iris controller, token-auth registry, git remotes,
GitHub stand-in. One build, amd64/standard, from request to merged PR — plus the checks that matter:
the digest agrees with an independent tool, the pin table holds it, the launcher is untouched, there
is exactly one Iris job, and no secret reached Temporal history, evidence files or the report."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowUpdateFailedError

from clients.github import GitHubClient
from clients.iris import IrisClient
from domain.models import MergeAuthorization, PipelineReport, target_workflow_id
from sandbox.demo import skopeo_digest
from sandbox.git_remotes import remote_head
from sandbox.stack import MARINSKYRL_SLUG
from tests.e2e.helpers import (
    awaiting_merge,
    git_show,
    is_closed,
    request,
    start_pipeline,
    wait_until,
    waiting_on_visibility,
)
from workflows.pipeline import BuildPipelineWorkflow
from workflows.target import TargetBuildWorkflow

pytestmark = pytest.mark.stack


async def test_build_to_merged_pr_with_visibility_gate_and_no_secret_leak(service_stack):
    s = service_stack
    launcher_before = git_show(s.remotes.marinskyrl_url, "main", "cloud/iris/launch_rl_iris.py")
    issue = "https://github.com/marin-community/MarinSkyRL/issues/7"
    handle = await start_pipeline(s, request(archs=("amd64", "arm64"), variants=("standard", "megatron"),
                                             issue_url=issue))
    wid = handle.id
    keys = ["amd64-standard", "amd64-megatron", "arm64-standard", "arm64-megatron"]

    # Green builds, private package: every target waits without rebuilding; the operator flips it public.
    jobs_before = {}
    for key in keys:
        waiting = await wait_until(lambda k=key: waiting_on_visibility(s.client, wid, k), what=f"{key} waiting")
        jobs_before[key] = list(waiting.job_ids)
    s.token_registry.set_public(s.image_repo_path, True)
    for key in keys:
        await s.client.get_workflow_handle(target_workflow_id(wid, key)).signal(TargetBuildWorkflow.recheck)

    # PR opened; an unlisted name is refused by the worker; the operator's approval is accepted while CI is
    # pending and the merge follows CI turning green without a second command.
    rep = await wait_until(lambda: awaiting_merge(s.client, wid), what="awaiting_merge")
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update(BuildPipelineWorkflow.approve_merge, MergeAuthorization(by="mallory"))
    assert refused.value.cause.type == "NotAuthorized"
    ack = await handle.execute_update(BuildPipelineWorkflow.approve_merge, MergeAuthorization(by="tester"))
    assert "accepted and queued" in ack and "required checks pending" in ack
    s.github.set_check(MARINSKYRL_SLUG, rep.pull_request.head_sha, "ci")
    final: PipelineReport = await handle.result()
    assert "authorized by tester, config:operators.logins" in final.message

    assert final.status == "merged" and final.merge_commit
    sha = final.source.build_commit
    by_key = {t.key: t for t in final.targets}
    assert sorted(by_key) == sorted(keys)
    expected_tags = {"amd64-standard": f"gpu-rl-{sha}", "amd64-megatron": f"gpu-rl-megatron-{sha}",
                     "arm64-standard": f"gpu-rl-{sha}-arm64", "arm64-megatron": f"gpu-rl-megatron-{sha}-arm64"}
    pins = git_show(s.remotes.marinskyrl_url, "main", "cloud/iris/gpu_rl_images.py")
    host = s.token_registry.host
    for key, t in by_key.items():
        assert t.status == "validated" and t.job_ids == jobs_before[key]  # the re-check did not rebuild
        assert t.tag == expected_tags[key]
        assert t.platform == f"linux/{t.architecture}" and t.validation.anonymous_pull == "pullable"
        assert not t.log_check.missing and t.log_check.final_push_seen
        assert skopeo_digest(host, t.image_ref, *s.token_registry.credentials) == t.digest
        assert t.digest in pins
    assert len({t.digest for t in final.targets}) == 4
    # The merged main carries the validated digests; the launcher is untouched; one Iris job per target.
    assert remote_head(s.remotes.marinskyrl_url) == final.merge_commit
    assert f'SOURCE_COMMIT = "{sha}"' in pins
    assert git_show(s.remotes.marinskyrl_url, "main", "cloud/iris/launch_rl_iris.py") == launcher_before
    async with IrisClient(s.iris.url, client_revision_date=s.config.clusters["sandbox-amd64"].client_revision_date) as iris:
        jobs = await iris.list_jobs(prefix="/gpu-rl-builder/gpurl-kaniko-")
    ours = sorted(j.job_id for j in jobs if f"-{sha[:8]}-" in j.job_id)
    assert ours == sorted(jid for t in final.targets for jid in t.job_ids)  # one job per target, no resubmits
    # planned name + this request's generation (domain.jobs.submission_name)
    assert sorted(j.rsplit("/", 1)[1].rsplit("-", 1)[0] for j in ours) == sorted(
        f"gpurl-kaniko-{k}-{sha[:8]}" for k in keys)

    # The evidence went to the PR body and, once, to the associated issue.
    async with GitHubClient(s.github.api_url, s.github.token, MARINSKYRL_SLUG) as gh:
        pr = await gh.get_pull(final.pull_request.number)
        comments = await gh.list_issue_comments(7)
    assert all(t.digest in pr.body for t in final.targets) and sha in pr.body
    assert len(comments) == 1 and all(t.digest in comments[0].body for t in final.targets)

    # Sentinel: the registry push token and the GitHub token appear nowhere we write or keep.
    secrets = [s.token_registry.push_token, s.github.token]
    histories = [await s.client.get_workflow_handle(w).fetch_history() for w in [wid, *(target_workflow_id(wid, k) for k in keys)]]
    kept = [h.to_json() for h in histories] + [final.model_dump_json()]
    for path in [*Path(s.config.work_dir).rglob("*"), *Path(s.config.evidence_url()).rglob("*")]:
        if path.is_file() and path.suffix in (".json", ".log", ".md", ".txt"):
            kept.append(path.read_text(errors="replace"))
    assert len(kept) > 3
    for secret in secrets:
        assert secret and all(secret not in text for text in kept)
    assert await is_closed(s.client, wid)
