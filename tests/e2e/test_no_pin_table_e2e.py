"""A repository without a pin table (the real era-C shape: no cloud/iris/gpu_rl_images.py) builds to a merged PR.

Real parts (Temporal dev server, Iris controller, token-auth registry, git remotes, GitHub stand-in) on the
sandbox fixture tree with its pin table deleted: the real era-C script cannot run on the sandbox (it stops at
its "disposable Iris task" guard, tests/e2e/test_real_tree_e2e.py), so the shape is reproduced on the fixture.
The plan says where the digests go before anything is built; the PR carries the re-pinned Dockerfiles and
the ops doc fixes (no pin commit); the digests with their evidence are in the PR body and the issue.
"""

from __future__ import annotations

import subprocess

import pytest

from clients.github import GitHubClient
from domain.models import MergeAuthorization, PipelineReport, target_workflow_id
from sandbox.git_remotes import commit_to_remote, remote_head
from sandbox.stack import MARINSKYRL_SLUG
from tests.e2e.helpers import (
    awaiting_merge,
    git_show,
    request,
    start_pipeline,
    wait_until,
    waiting_on_visibility,
)
from workflows.pipeline import BuildPipelineWorkflow
from workflows.target import TargetBuildWorkflow

pytestmark = pytest.mark.stack

PINS = "cloud/iris/gpu_rl_images.py"
LAUNCHER = "cloud/iris/launch_rl_iris.py"
OPS = ".agents/ops/gpu-rl-image-build.md"
KEY = "amd64-standard"


async def test_no_pin_table_build_ends_merged_with_digests_in_the_pr_body_and_the_issue(service_stack):
    s = service_stack
    url = s.remotes.marinskyrl_url
    commit_to_remote(url, {PINS: None}, "No pin table, as in the real era-C tree")
    launcher_before = git_show(url, "main", LAUNCHER)
    handle = await start_pipeline(s, request(issue_url="https://github.com/marin-community/MarinSkyRL/issues/9"))
    await wait_until(lambda: waiting_on_visibility(s.client, handle.id, KEY), what="visibility wait")
    s.token_registry.set_public(s.image_repo_path, True)
    await s.client.get_workflow_handle(target_workflow_id(handle.id, KEY)).signal(TargetBuildWorkflow.recheck)
    rep = await wait_until(lambda: awaiting_merge(s.client, handle.id), what="PR opened")
    src = rep.source
    assert (src.digests_in, src.pin_table) == ("pr_body", None) and PINS in src.pin_target_reason
    # The PR is the build commit itself: re-pinned Dockerfiles and the corrected ops doc, no pin commit.
    assert rep.pull_request.pin_commit == src.build_commit == rep.pull_request.head_sha
    assert OPS in src.changed_files and src.ops_doc_corrected and src.ops_corrections
    await handle.execute_update(BuildPipelineWorkflow.approve_merge, MergeAuthorization(by="tester"))
    s.github.set_check(MARINSKYRL_SLUG, rep.pull_request.head_sha, "ci")
    final: PipelineReport = await handle.result()
    assert final.status == "merged" and final.merge_commit == remote_head(url)
    digest = final.targets[0].digest
    assert digest and final.targets[0].status == "validated"
    async with GitHubClient(s.github.api_url, s.github.token, MARINSKYRL_SLUG) as gh:
        pr = await gh.get_pull(final.pull_request.number)
        comments = await gh.list_issue_comments(9)
    for body in (pr.body, comments[0].body):
        assert "Digests recorded here and in the issue, not in a pin table" in body
        assert f"@{digest}" in body and final.source.build_commit[:12] in body
        assert "Stale ops documentation corrected in the build commit" in body
        assert f"{OPS}:" in body.replace("\\", "")  # each corrected line, file:line
    assert len(comments) == 1
    # Merged main: still no pin table, the launcher untouched, the Dockerfiles re-pinned, the doc corrected.
    assert git_show(url, "main", LAUNCHER) == launcher_before
    with pytest.raises(subprocess.CalledProcessError):
        git_show(url, "main", PINS)
    df = git_show(url, "main", "docker/Dockerfile.gpu-rl")
    assert f"HARBOR_COMMIT={final.source.harbor_commit}" in df
    assert git_show(url, "main", OPS) != git_show(url, src.base_commit, OPS)
