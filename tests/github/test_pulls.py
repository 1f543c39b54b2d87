"""Pull requests against the stand-in: idempotent ensure_pull, 422 duplicates, merge semantics."""

from __future__ import annotations

import git
import pytest

from clients.github import HeadMoved, NotFound, NotMergeable, ValidationFailed
from tests.fixtures_github import GitHubStandinRepo


async def test_ensure_pull_opens_once_and_updates_body(github_standin: GitHubStandinRepo):
    async with github_standin.client() as gh:
        first = await gh.ensure_pull("feature", "main", "Bump pins", "body v1")
        again = await gh.ensure_pull("feature", "main", "Bump pins", "body v1")
        updated = await gh.ensure_pull("feature", "main", "Bump pins (2)", "body v2")
        fetched = await gh.get_pull(first.number)
        found = await gh.find_pull("feature", "main")

    assert again.number == first.number == updated.number
    assert fetched.body == "body v2" and fetched.title == "Bump pins (2)"
    assert found is not None and found.number == first.number
    assert fetched.state == "open" and fetched.head_sha == github_standin.branch_sha("feature")
    assert fetched.mergeable is True and fetched.merged is False


async def test_find_pull_none_when_absent(github_standin: GitHubStandinRepo):
    async with github_standin.client() as gh:
        assert await gh.find_pull("feature", "main") is None
        await gh.ensure_pull("feature", "main", "t", "b")
        assert await gh.find_pull("feature", "conflict") is None  # other base
        assert await gh.find_pull("conflict", "main") is None  # other head


async def test_duplicate_create_is_422(github_standin: GitHubStandinRepo):
    async with github_standin.client() as gh:
        await gh.create_pull("feature", "main", "t", "b")
        with pytest.raises(ValidationFailed) as info:
            await gh.create_pull("feature", "main", "t", "b")
    assert info.value.status == 422
    assert any(e.get("message") == "A pull request already exists for acme:feature." for e in info.value.errors)


async def test_create_with_unknown_branch_is_422(github_standin: GitHubStandinRepo):
    async with github_standin.client() as gh:
        with pytest.raises(ValidationFailed) as info:
            await gh.create_pull("no-such-branch", "main", "t", "b")
    assert {"resource": "PullRequest", "field": "head", "code": "invalid"} in info.value.errors


async def test_missing_pull_and_repo_are_404(github_standin: GitHubStandinRepo):
    async with github_standin.client() as gh:
        with pytest.raises(NotFound):
            await gh.get_pull(999)
    async with github_standin.client() as gh:
        gh.repo = "acme/unknown"
        with pytest.raises(NotFound):
            await gh.find_pull("feature", "main")


async def test_merge_refused_with_wrong_sha(github_standin: GitHubStandinRepo):
    main_before = github_standin.branch_sha("main")
    async with github_standin.client() as gh:
        pull = await gh.ensure_pull("feature", "main", "t", "b")
        with pytest.raises(HeadMoved) as info:
            await gh.merge_pull(pull.number, "0" * 40)
        after = await gh.get_pull(pull.number)
    assert info.value.status == 409 and "Head branch was modified" in str(info.value)
    assert after.state == "open" and not after.merged
    assert github_standin.branch_sha("main") == main_before


async def test_merge_refused_after_head_moves(github_standin: GitHubStandinRepo):
    async with github_standin.client() as gh:
        pull = await gh.ensure_pull("feature", "main", "t", "b")
        new_sha = github_standin.push_commit("feature", "extra.txt", "x\n")
        with pytest.raises(HeadMoved):
            await gh.merge_pull(pull.number, pull.head_sha)
        live = await gh.get_pull(pull.number)
    assert live.head_sha == new_sha != pull.head_sha


async def test_merge_refused_when_not_mergeable(github_standin: GitHubStandinRepo):
    main_before = github_standin.branch_sha("main")
    async with github_standin.client() as gh:
        pull = await gh.ensure_pull("conflict", "main", "t", "b")
        assert pull.mergeable is False
        with pytest.raises(NotMergeable) as info:
            await gh.merge_pull(pull.number, pull.head_sha)
    assert info.value.status == 405 and "not mergeable" in str(info.value)
    assert github_standin.branch_sha("main") == main_before


async def test_merge_with_right_sha_creates_real_merge_commit(github_standin: GitHubStandinRepo):
    main_before = github_standin.branch_sha("main")
    async with github_standin.client() as gh:
        pull = await gh.ensure_pull("feature", "main", "Bump pins", "b")
        result = await gh.merge_pull(pull.number, pull.head_sha)
        merged = await gh.get_pull(pull.number)
        again = await gh.ensure_pull("feature", "main", "Bump pins", "b")  # a retried step after merge
        with pytest.raises(NotMergeable):
            await gh.merge_pull(pull.number, pull.head_sha)

    assert result.merged and result.message == "Pull Request successfully merged"
    bare = git.Repo(github_standin.bare)
    commit = bare.commit("refs/heads/main")
    assert commit.hexsha == result.sha
    assert {p.hexsha for p in commit.parents} == {main_before, pull.head_sha}
    assert (commit.tree / "pins.txt").data_stream.read() == b"pin=new\n"
    assert merged.state == "closed" and merged.merged and merged.merge_commit_sha == result.sha
    assert again.number == pull.number and again.merged


async def test_squash_merge_has_single_parent(github_standin: GitHubStandinRepo):
    main_before = github_standin.branch_sha("main")
    async with github_standin.client() as gh:
        pull = await gh.ensure_pull("feature", "main", "Bump pins", "b")
        result = await gh.merge_pull(pull.number, pull.head_sha, method="squash")
    commit = git.Repo(github_standin.bare).commit(result.sha)
    assert [p.hexsha for p in commit.parents] == [main_before]
    assert commit.summary == f"Bump pins (#{pull.number})"


async def test_merge_refused_when_head_already_in_base(github_standin: GitHubStandinRepo):
    work = github_standin.work
    work.git.fetch("origin")
    work.git.checkout("-B", "topic", "origin/main")
    work.git.push("origin", "HEAD:refs/heads/topic")
    sha = github_standin.push_commit("topic", "topic.txt", "t\n")
    async with github_standin.client() as gh:
        pull = await gh.ensure_pull("topic", "main", "t", "b")
        work.git.push("origin", f"{sha}:refs/heads/main")  # someone fast-forwards main by hand
        with pytest.raises(NotMergeable):
            await gh.merge_pull(pull.number, sha)
    assert github_standin.branch_sha("main") == sha
