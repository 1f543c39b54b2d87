"""The whole 'prepare immutable source' step on the sandbox's MarinSkyRL-shaped and Harbor remotes."""

from __future__ import annotations

from pathlib import Path

from clients.bundle import build_bundle
from clients.git_source import (
    MirrorCache,
    commit_build_change,
    create_worktree,
    list_files_at,
    read_dockerfile_args,
    read_files_at,
    repin_dockerfiles,
    resolve_ref,
)
from domain.harbor_manifest import diff_manifests, extras_installed_by_dockerfile, parse_harbor_manifest


def test_prepare_source_on_sandbox_remotes(seeded_remotes, tmp_path: Path):
    mirrors = MirrorCache(tmp_path / "mirrors")
    msr = mirrors.fetch(seeded_remotes.marinskyrl_url)
    harbor = mirrors.fetch(seeded_remotes.harbor_url)
    assert msr.head_sha == seeded_remotes.marinskyrl_head

    dockerfiles = [p for p in list_files_at(msr, msr.head_sha, "docker") if "/Dockerfile" in p]
    assert len(dockerfiles) >= 2
    texts = read_files_at(msr, msr.head_sha, dockerfiles)
    pinned = {read_dockerfile_args(t)["HARBOR_COMMIT"] for t in texts.values()}
    assert pinned == {seeded_remotes.harbor_commits[0]}
    latest = resolve_ref(harbor)
    assert latest != seeded_remotes.harbor_commits[0]

    extras = extras_installed_by_dockerfile(texts[dockerfiles[0]])
    old, new = (parse_harbor_manifest(read_files_at(harbor, sha, ["pyproject.toml"])["pyproject.toml"])
                for sha in (seeded_remotes.harbor_commits[0], latest))
    diff = diff_manifests(old, new, extras)
    assert diff.summary_lines and not diff.empty

    worktree = create_worktree(msr, msr.head_sha, tmp_path / "wt")
    assert repin_dockerfiles(worktree, dockerfiles, {"HARBOR_COMMIT": latest}) == dockerfiles
    result = commit_build_change(worktree, message="Pin Harbor", request_id="sandbox-1",
                                 author="Builder <builder@example.invalid>")
    assert result.created
    for rel in dockerfiles:
        assert read_dockerfile_args((worktree / rel).read_text())["HARBOR_COMMIT"] == latest

    info = build_bundle(worktree, tmp_path / "bundle.zip")
    assert info.suspicious == [] and info.file_count > 5
    assert build_bundle(worktree, tmp_path / "again.zip").sha256 == info.sha256
