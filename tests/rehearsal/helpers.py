"""Plan a real (or fixture) tree in-process and rehearse its targets: contract, plan, bundle, bwrap."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from clients.bundle import build_bundle
from domain.buildset import BuildRequest, CompatibilityRequest, TargetSpec, plan_targets
from domain.contract import load_contract
from rehearsal import runner
from tests.contract.real import commit_tree, files_at

FIXTURE = Path(__file__).resolve().parents[2] / "sandbox" / "fixtures"
IMAGES = None  # rehearsal.task_image.TaskImages, set by conftest.py (the session's stand-in task image)
TASK_IMAGE = "docker.io/library/ubuntu:22.04"
# Which isolation the rehearsal tests use (policy.rehearsal_isolation): GPU_RL_TEST_ISOLATION=proot runs
# them all under proot, as a worker under Pod Security baseline would.
ISOLATION = os.environ.get("GPU_RL_TEST_ISOLATION", "auto")


def need_isolation() -> None:
    reason = runner.isolation_unavailable(ISOLATION)
    if reason:
        pytest.skip(f"rehearsal cannot isolate on this host: {reason}")


def planned(tmp_path: Path, era: str, edits=None, arches: list[str] | None = None, push_floating: bool = False,
            executable: tuple[str, ...] = ()):
    """(contract, targets, bundle, script text) for ``era`` (a real tree, or "fixture") after ``edits``."""
    if era == "fixture":
        import tests.contract.real as real

        saved, real.REAL = real.REAL, FIXTURE
        try:
            repo, sha = commit_tree(tmp_path, "marinskyrl", edits, executable=executable)
        finally:
            real.REAL = saved
    else:
        repo, sha = commit_tree(tmp_path, era, edits, rest=True, executable=executable)
    files = files_at(repo, sha)
    contract = load_contract(files, sha)
    harbor = next(iter(contract.dockerfiles.values())).pins["HARBOR_COMMIT"]
    for df in contract.dockerfiles.values():  # as if the service had re-pinned every Dockerfile
        df.pins["HARBOR_COMMIT"] = harbor
        df.global_args["HARBOR_COMMIT"] = harbor
    archs = arches or [a for a in sorted(contract.script.arches) if not contract.script.arches[a].blocked]
    request = BuildRequest(architectures=archs, push_floating=push_floating,
                           compatibility_request=CompatibilityRequest(requested_by="t", reason="rehearsal test"))
    targets = plan_targets(contract, request, build_commit=sha, harbor_commit=harbor, cluster_archs=None,
                           image_repository_override=None)
    bundle = build_bundle(Path(repo.working_dir), tmp_path / "bundle.zip")
    return contract, targets, bundle, files[contract.script.path], harbor


def rehearse(contract, targets: list[TargetSpec], bundle, script: str, harbor: str,
             cluster_env: dict[str, dict[str, str]] | None = None, mode: str = "required", images=None,
             isolation: str | None = None, **kw) -> str | None:
    return runner.rehearse_targets(contract, targets, bundle_path=bundle.path, bundle_sha256=bundle.sha256,
                                      script_text=script, harbor_commit=harbor, cluster_env=cluster_env or {},
                                      images=images or IMAGES, mode=mode, isolation=isolation or ISOLATION, **kw)


def image_root(platform: str = "linux/amd64"):
    """The unpacked stand-in task image, for calling ``rehearsal.run`` directly."""
    return IMAGES.root(TASK_IMAGE, platform)
