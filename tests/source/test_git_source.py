"""Immutable source preparation against real git remotes made in tmp_path."""

from __future__ import annotations

from pathlib import Path

import git
import pytest

from clients.git_source import (
    BranchConflict,
    DirtyWorktree,
    DivergedWorktree,
    GitCommandFailed,
    MirrorCache,
    MissingPin,
    PathNotFound,
    RefNotFound,
    RemoteNotFound,
    UnmanagedWorktree,
    adopt_pushed_commit,
    build_request_of,
    changed_paths,
    commit_build_change,
    create_worktree,
    list_files_at,
    push_branch,
    read_dockerfile_args,
    read_files_at,
    redact_url,
    remote_branch_sha,
    repin_dockerfiles,
    resolve_ref,
)
from domain.harbor_manifest import diff_manifests, extras_installed_by_dockerfile, parse_harbor_manifest
from tests.source.repos import AUTHOR, DOCKERFILES, Remotes, commit_to_remote


def _prepare(remotes: Remotes, mirrors: MirrorCache, dest: Path, request_id: str = "req-1"):
    """The runbook's 'prepare immutable source' step, as an activity would run it."""
    msr = mirrors.fetch(remotes.marinskyrl_url)
    harbor = mirrors.fetch(remotes.harbor_url)
    base = resolve_ref(msr)
    new_harbor = resolve_ref(harbor)
    worktree = create_worktree(msr, base, dest)
    changed = repin_dockerfiles(worktree, DOCKERFILES, {"HARBOR_COMMIT": new_harbor})
    result = commit_build_change(worktree, message=f"Pin Harbor {new_harbor[:12]}", request_id=request_id,
                                 author=AUTHOR)
    return msr, base, worktree, changed, result


def test_fetch_detects_default_branch_and_refreshes(remotes: Remotes, mirrors: MirrorCache, tmp_path: Path):
    fetched = mirrors.fetch(remotes.harbor_url)
    assert fetched.default_branch == "main" and fetched.head_sha == remotes.harbor_commits[-1]
    assert fetched.path.parent == mirrors.root
    new = commit_to_remote(remotes.harbor_url, {"NEWS": "x\n"}, "news", tmp_path / "c1")
    again = mirrors.fetch(remotes.harbor_url)
    assert again.path == fetched.path and again.head_sha == new
    # The remote switches its default branch: detected on the next fetch.
    bare = git.Repo(remotes.harbor_url.removeprefix("file://"))
    bare.git.branch("release", remotes.harbor_commits[0])
    bare.git.symbolic_ref("HEAD", "refs/heads/release")
    switched = mirrors.fetch(remotes.harbor_url)
    assert switched.default_branch == "release" and switched.head_sha == remotes.harbor_commits[0]


def test_fetch_recovers_from_a_half_created_mirror(remotes: Remotes, mirrors: MirrorCache):
    path = mirrors.mirror_path(remotes.harbor_url)
    path.mkdir(parents=True)
    (path / "junk").write_text("crash leftovers")
    assert mirrors.fetch(remotes.harbor_url).head_sha == remotes.harbor_commits[-1]


def test_fetch_errors_are_redacted(mirrors: MirrorCache, tmp_path: Path):
    for url in (f"file://user:sekrit-token@{tmp_path}/missing.git", "https://u:sekrit-token@127.0.0.1:1/r.git"):
        # a missing repository is a final refusal (RemoteNotFound), an unreachable host a network failure
        with pytest.raises((GitCommandFailed, RemoteNotFound)) as err:
            mirrors.fetch(url)
        assert "sekrit-token" not in str(err.value)
        assert "sekrit-token" not in str(mirrors.mirror_path(url))
        assert not any("sekrit-token" in p.read_text(errors="ignore")
                       for p in mirrors.root.rglob("*") if p.is_file())
    assert redact_url("see https://x:tok@github.com/a/b.git") == "see https://***@github.com/a/b.git"


def test_resolve_ref_branch_tag_sha(remotes: Remotes, mirrors: MirrorCache):
    first, second, third = remotes.harbor_commits
    bare = git.Repo(remotes.harbor_url.removeprefix("file://"))
    bare.create_tag("v0.2", ref=second, message="annotated")
    fetched = mirrors.fetch(remotes.harbor_url)
    assert resolve_ref(fetched) == third
    assert resolve_ref(fetched, "main") == third
    assert resolve_ref(fetched, "v0.2") == second  # annotated tag peeled to its commit
    assert resolve_ref(fetched, first[:10]) == first
    with pytest.raises(RefNotFound):
        resolve_ref(fetched, "no-such-branch")


def test_read_and_list_files_at_commit(remotes: Remotes, mirrors: MirrorCache):
    fetched = mirrors.fetch(remotes.harbor_url)
    first, _, third = remotes.harbor_commits
    texts = read_files_at(fetched, first, ["pyproject.toml"])
    assert 'version = "0.1.0"' in texts["pyproject.toml"] and texts["pyproject.toml"].endswith("]\n")
    assert list_files_at(fetched, first) == ["pyproject.toml", "src/harbor/__init__.py"]
    assert list_files_at(fetched, third, "src") == ["src/harbor/__init__.py"]
    with pytest.raises(PathNotFound, match="README.md"):
        read_files_at(fetched, first, ["README.md"])
    assert read_files_at(fetched, first, ["README.md"], missing_ok=True) == {}
    assert changed_paths(fetched, first, third) == ["README.md", "pyproject.toml", "src/harbor/__init__.py"]


def test_harbor_diff_between_pinned_and_latest(remotes: Remotes, mirrors: MirrorCache):
    msr = mirrors.fetch(remotes.marinskyrl_url)
    harbor = mirrors.fetch(remotes.harbor_url)
    dockerfile = read_files_at(msr, msr.head_sha, [DOCKERFILES[0]])[DOCKERFILES[0]]
    pinned = read_dockerfile_args(dockerfile)["HARBOR_COMMIT"]
    assert pinned == remotes.harbor_commits[0]
    latest = resolve_ref(harbor)
    texts = [read_files_at(harbor, sha, ["pyproject.toml"])["pyproject.toml"] for sha in (pinned, latest)]
    diff = diff_manifests(*map(parse_harbor_manifest, texts), extras_installed_by_dockerfile(dockerfile))
    assert diff.affects_image and {m.name for m in diff.moved} == {"datasets", "claude-agent-sdk"}


def test_harbor_move_makes_one_commit_touching_every_dockerfile(
    remotes: Remotes, mirrors: MirrorCache, tmp_path: Path
):
    msr, base, worktree, changed, result = _prepare(remotes, mirrors, tmp_path / "wt")
    assert changed == DOCKERFILES and result.created
    repo = git.Repo(worktree)
    head = repo.head.commit
    assert head.hexsha == result.sha and [p.hexsha for p in head.parents] == [base]
    assert build_request_of(head.message) == "req-1"
    assert head.author.email == "fixture@example.invalid"
    assert sorted(head.stats.files) == sorted(DOCKERFILES)
    latest = remotes.harbor_commits[-1]
    for rel in DOCKERFILES:
        text = (worktree / rel).read_text()
        assert f"ARG HARBOR_COMMIT={latest}\n" in text
        assert read_dockerfile_args(text)["FLASH_ATTN_VERSION"] == "2.8.3"  # other pins untouched
    # The operator's tree (the bare remote) is untouched until we push.
    assert git.Repo(remotes.marinskyrl_url.removeprefix("file://")).head.commit.hexsha == base


def test_repeated_run_makes_no_second_commit(remotes: Remotes, mirrors: MirrorCache, tmp_path: Path):
    *_, first = _prepare(remotes, mirrors, tmp_path / "wt")
    *_, changed, second = _prepare(remotes, mirrors, tmp_path / "wt")
    assert changed == [] and second.sha == first.sha and not second.created
    # A crash between commit and the activity's return looks the same on retry.
    again = commit_build_change(tmp_path / "wt", message="x", request_id="req-1", author=AUTHOR)
    assert again.sha == first.sha and not again.created


def test_no_change_returns_base_commit(remotes: Remotes, mirrors: MirrorCache, tmp_path: Path):
    msr = mirrors.fetch(remotes.marinskyrl_url)
    worktree = create_worktree(msr, msr.head_sha, tmp_path / "wt")
    pinned = remotes.harbor_commits[0]
    assert repin_dockerfiles(worktree, DOCKERFILES, {"HARBOR_COMMIT": pinned}) == []
    result = commit_build_change(worktree, message="noop", request_id="req-2", author=AUTHOR)
    assert result.sha == msr.head_sha and not result.created


def test_dirty_worktree_refused(remotes: Remotes, mirrors: MirrorCache, tmp_path: Path):
    msr = mirrors.fetch(remotes.marinskyrl_url)
    dest = create_worktree(msr, msr.head_sha, tmp_path / "wt")
    (dest / "README.md").write_text("operator edit\n")
    (dest / "stray.txt").write_text("?\n")
    with pytest.raises(DirtyWorktree) as err:
        create_worktree(msr, msr.head_sha, dest)
    assert str(dest) in str(err.value) and "README.md" in str(err.value) and "stray.txt" in str(err.value)


def test_diverged_worktree_refused(remotes: Remotes, mirrors: MirrorCache, tmp_path: Path):
    msr = mirrors.fetch(remotes.marinskyrl_url)
    dest = create_worktree(msr, msr.head_sha, tmp_path / "wt")
    (dest / "README.md").write_text("someone else\n")
    repo = git.Repo(dest)
    repo.git.execute(["git", "-c", "user.name=x", "-c", "user.email=x@e", "commit", "-qam", "not ours"])
    with pytest.raises(DivergedWorktree) as err:
        create_worktree(msr, msr.head_sha, dest)
    assert str(dest) in str(err.value) and repo.head.commit.hexsha in str(err.value)
    # A newer base than the worktree holds is also a divergence, not a silent reuse.
    new_base = commit_to_remote(remotes.marinskyrl_url, {"cloud/iris/x.py": "1\n"}, "x", tmp_path / "c")
    fresh = mirrors.fetch(remotes.marinskyrl_url)
    assert fresh.head_sha == new_base
    clean = create_worktree(fresh, msr.head_sha, tmp_path / "wt2")
    with pytest.raises(DivergedWorktree):
        create_worktree(fresh, new_base, clean)


def test_operator_checkout_is_never_reused(remotes: Remotes, mirrors: MirrorCache, tmp_path: Path):
    msr = mirrors.fetch(remotes.marinskyrl_url)
    operator = git.Repo.clone_from(remotes.marinskyrl_url, tmp_path / "operator")
    with pytest.raises(UnmanagedWorktree, match="not created by this service"):
        create_worktree(msr, msr.head_sha, Path(operator.working_tree_dir))
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "f").write_text("x")
    with pytest.raises(UnmanagedWorktree, match="not a git checkout"):
        create_worktree(msr, msr.head_sha, tmp_path / "plain")


def test_missing_pin_is_an_error_unless_optional(remotes: Remotes, mirrors: MirrorCache, tmp_path: Path):
    msr = mirrors.fetch(remotes.marinskyrl_url)
    worktree = create_worktree(msr, msr.head_sha, tmp_path / "wt")
    before = (worktree / DOCKERFILES[0]).read_text()
    pins = {"HARBOR_COMMIT": "a" * 40, "VLLM_NATIVE_DONOR_COMMIT": "b" * 40}
    with pytest.raises(MissingPin) as err:
        repin_dockerfiles(worktree, DOCKERFILES, pins)
    assert err.value.dockerfile == DOCKERFILES[0] and err.value.arg == "VLLM_NATIVE_DONOR_COMMIT"
    assert (worktree / DOCKERFILES[0]).read_text() == before  # nothing written on error
    optional = {rel: {"VLLM_NATIVE_DONOR_COMMIT"} for rel in DOCKERFILES}
    assert repin_dockerfiles(worktree, DOCKERFILES, pins, optional=optional) == DOCKERFILES
    with pytest.raises(ValueError, match="unsafe"):
        repin_dockerfiles(worktree, DOCKERFILES, {"HARBOR_COMMIT": "x\nRUN evil"})


def test_push_branch_idempotent_and_conflict(remotes: Remotes, mirrors: MirrorCache, tmp_path: Path):
    _, base, worktree, _, result = _prepare(remotes, mirrors, tmp_path / "wt")
    url = remotes.marinskyrl_url
    push_branch(worktree, url, "build/req-1", result.sha)
    push_branch(worktree, url, "build/req-1", result.sha)  # again: no-op
    assert remote_branch_sha(worktree, url, "build/req-1") == result.sha
    # Fast-forward from an ancestor is allowed.
    push_branch(worktree, url, "build/ff", base)
    push_branch(worktree, url, "build/ff", result.sha)
    assert remote_branch_sha(worktree, url, "build/ff") == result.sha
    # Someone else moved the branch to an unrelated commit: refuse.
    other = commit_to_remote(url, {"README.md": "other\n"}, "other", tmp_path / "c", branch="build/req-1")
    with pytest.raises(BranchConflict) as err:
        push_branch(worktree, url, "build/req-1", result.sha)
    assert err.value.remote_sha == other and "build/req-1" in str(err.value)
    assert remote_branch_sha(worktree, url, "build/req-1") == other


def test_a_rerun_keeps_and_reuses_its_own_pushed_pin_commit(remotes: Remotes, mirrors: MirrorCache, tmp_path: Path):
    """Failure in recording, then a re-run: the branch holds build + pins commits of this request. The
    re-run's publish leaves them (not a conflict) and its record step reuses the pushed pins commit when
    it writes the same content, in another work directory and at another time."""
    _, _, worktree, _, build = _prepare(remotes, mirrors, tmp_path / "wt")
    url, branch = remotes.marinskyrl_url, "build/req-1"
    push_branch(worktree, url, branch, build.sha)
    first = create_worktree(mirrors.fetch(url), build.sha, tmp_path / "rec-1")
    (first / "PINS.txt").write_text("amd64 sha256:aaa\n")
    pins = commit_build_change(first, message="pins", request_id="req-1-pins", author=AUTHOR)
    push_branch(first, url, branch, pins.sha)

    push_branch(worktree, url, branch, build.sha, keep_own=("req-1-pins",))  # the re-run's publish
    assert remote_branch_sha(worktree, url, branch) == pins.sha
    with pytest.raises(BranchConflict):  # without naming its own commits it is still refused
        push_branch(worktree, url, branch, build.sha)

    again = create_worktree(mirrors.fetch(url), build.sha, tmp_path / "rec-2")
    (again / "PINS.txt").write_text("amd64 sha256:aaa\n")
    assert adopt_pushed_commit(again, url, branch, request_id="req-1-pins", parent=build.sha) == pins.sha
    assert git.Repo(again).head.commit.hexsha == pins.sha and not git.Repo(again).is_dirty(untracked_files=True)
    other = create_worktree(mirrors.fetch(url), build.sha, tmp_path / "rec-3")
    (other / "PINS.txt").write_text("amd64 sha256:bbb\n")  # different digests: not reused
    assert adopt_pushed_commit(other, url, branch, request_id="req-1-pins", parent=build.sha) is None


def test_its_own_pin_commit_with_other_content_is_replaced_with_a_lease_and_nothing_else_is(
        remotes: Remotes, mirrors: MirrorCache, tmp_path: Path):
    """A target rebuilt since (new digest): the record step's new pin commit replaces the earlier one of
    the same request on the service's own branch (force-with-lease); a commit of anyone else on top is
    never overwritten."""
    _, _, worktree, _, build = _prepare(remotes, mirrors, tmp_path / "wt")
    url, branch = remotes.marinskyrl_url, "build/req-2"
    push_branch(worktree, url, branch, build.sha)
    old = create_worktree(mirrors.fetch(url), build.sha, tmp_path / "rec-1")
    (old / "PINS.txt").write_text("amd64 sha256:aaa\n")
    first = commit_build_change(old, message="pins", request_id="req-2-pins", author=AUTHOR)
    push_branch(old, url, branch, first.sha)
    new = create_worktree(mirrors.fetch(url), build.sha, tmp_path / "rec-2")
    (new / "PINS.txt").write_text("amd64 sha256:bbb\n")
    second = commit_build_change(new, message="pins", request_id="req-2-pins", author=AUTHOR)
    with pytest.raises(BranchConflict):  # not fast-forward, and not told it may replace its own
        push_branch(new, url, branch, second.sha)
    push_branch(new, url, branch, second.sha, replace_own="req-2-pins")
    assert remote_branch_sha(worktree, url, branch) == second.sha
    # someone else's commit on the branch: never replaced
    foreign = commit_to_remote(url, {"NOTES.md": "mine\n"}, "a human's commit", tmp_path / "human", branch=branch)
    third_wt = create_worktree(mirrors.fetch(url), build.sha, tmp_path / "rec-3")
    (third_wt / "PINS.txt").write_text("amd64 sha256:ccc\n")
    third = commit_build_change(third_wt, message="pins", request_id="req-2-pins", author=AUTHOR)
    with pytest.raises(BranchConflict):
        push_branch(third_wt, url, branch, third.sha, replace_own="req-2-pins")
    assert remote_branch_sha(worktree, url, branch) == foreign


def test_changed_paths_for_rebuild_boundary(remotes: Remotes, mirrors: MirrorCache, tmp_path: Path):
    base = remotes.marinskyrl_head
    new = commit_to_remote(remotes.marinskyrl_url, {"cloud/iris/configs/a.yaml": "a: 1\n",
                                                    "skyrl-train/skyrl_train/x.py": "y = 2\n"},
                           "touch both", tmp_path / "c")
    fetched = mirrors.fetch(remotes.marinskyrl_url)
    assert changed_paths(fetched, base, new) == ["cloud/iris/configs/a.yaml", "skyrl-train/skyrl_train/x.py"]


def test_read_files_at_unknown_commit_is_a_typed_error(remotes, mirrors):
    from clients.git_source import RefNotFound

    fetched = mirrors.fetch(remotes.marinskyrl_url)
    with pytest.raises(RefNotFound, match="0000000000"):
        read_files_at(fetched, "0" * 40, ["AGENTS.md"])
