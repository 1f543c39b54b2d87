"""The record step never touches protected files: the Iris training launcher (AGENTS.md policy) or any
path on github.do_not_touch — whether configured as the pin table or modified by the lint command."""

from __future__ import annotations

import subprocess

import pytest
from temporalio.exceptions import ApplicationError

from activities.record import RecordActivities
from domain.buildset import BuildRequest, CompatibilityRequest
from domain.models import BundleSummary, RecordInput, SourceSnapshot, TargetResult
from tests.fixtures_git import fresh_remotes

LAUNCHER = "cloud/iris/launch_rl_iris.py"


def _inp(remotes) -> RecordInput:
    head = remotes.marinskyrl_head
    src = SourceSnapshot(build_commit=head, base_commit=head, branch="gpu-rl-build/guard", pushed=True,
                         created_commit=False, harbor_commit=remotes.harbor_pinned, harbor_diff=None,
                         changed_files=[], ops_doc_corrected=False,
                         bundle=BundleSummary(sha256="0" * 64, size_bytes=1, file_count=1))
    target = TargetResult(key="amd64-standard", architecture="amd64", variant="standard", status="validated",
                          cluster="c", job_ids=["/u/j"], tag=f"gpu-rl-{head}", image_ref="r:t",
                          digest="sha256:" + "a" * 64)
    req = BuildRequest(architectures=["amd64"], variants=["standard"],
                       compatibility_request=CompatibilityRequest(requested_by="t", reason="t"))
    return RecordInput(request_id="guard", request=req, source=src, targets=[target])


def _config(tmp_path, remotes, **github):
    from domain.config import ServiceConfig

    return ServiceConfig.model_validate({
        "work_dir": str(tmp_path / "work"),
        "repos": {"marinskyrl_url": remotes.marinskyrl_url, "harbor_url": remotes.harbor_url},
        "clusters": {},
        "registry": {"image_repository": "127.0.0.1:5000/gpu-rl", "user": {"kind": "literal_public", "value": "u"}, "token": {"kind": "env", "name": "X"}},
        "github": {"token": {"kind": "env", "name": "X"}, **github},
    })


def _branch_exists(remotes, branch: str) -> bool:
    out = subprocess.run(["git", "--git-dir", remotes.marinskyrl_url.removeprefix("file://"), "branch", "--list",
                          branch], capture_output=True, text=True, check=True).stdout
    return bool(out.strip())


def test_launcher_as_pin_table_is_refused_by_repository_policy(tmp_path):
    remotes = fresh_remotes(tmp_path / "remotes")
    acts = RecordActivities(_config(tmp_path, remotes, pin_table_path=LAUNCHER, do_not_touch=[]))
    with pytest.raises(ApplicationError, match=f"{LAUNCHER} is protected"):
        acts._commit_pins(_inp(remotes), acts.config.github)
    assert not _branch_exists(remotes, "gpu-rl-build/guard")


def test_lint_step_touching_a_protected_file_is_refused_and_nothing_committed(tmp_path):
    remotes = fresh_remotes(tmp_path / "remotes")
    acts = RecordActivities(_config(tmp_path, remotes, lint_command=["sh", "-c", f"echo '# lint' >> {LAUNCHER}"]))
    with pytest.raises(ApplicationError, match=f"refusing to modify {LAUNCHER}"):
        acts._commit_pins(_inp(remotes), acts.config.github)
    assert not _branch_exists(remotes, "gpu-rl-build/guard")


def test_pin_table_update_commits_only_the_pin_table(tmp_path):
    remotes = fresh_remotes(tmp_path / "remotes")
    acts = RecordActivities(_config(tmp_path, remotes))
    sha, base = acts._commit_pins(_inp(remotes), acts.config.github)
    assert base == "main"
    changed = subprocess.run(["git", "--git-dir", remotes.marinskyrl_url.removeprefix("file://"), "diff",
                              "--name-only", remotes.marinskyrl_head, sha], capture_output=True, text=True,
                             check=True).stdout.split()
    assert changed == ["cloud/iris/gpu_rl_images.py"]
    # Idempotent: a retried record finds its own commit instead of making a second one.
    assert acts._commit_pins(_inp(remotes), acts.config.github)[0] == sha
