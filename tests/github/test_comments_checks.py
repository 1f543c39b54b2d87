"""Comments (upsert by hidden marker, pagination), checks, statuses and reviews against the stand-in."""

from __future__ import annotations

import asyncio

import pytest

from clients.github import (
    CheckRun,
    CombinedStatus,
    CommitStatus,
    GitHubClient,
    checks_state,
    comment_marker,
)
from sandbox.github_standin import start_github_standin
from tests.fixtures_github import GitHubStandinRepo


async def test_upsert_comment_edits_instead_of_duplicating(github_standin: GitHubStandinRepo):
    marker = comment_marker("build-report")
    async with github_standin.client() as gh:
        first = await gh.upsert_comment(7, marker, "build running")
        second = await gh.upsert_comment(7, marker, "build done")
        other = await gh.upsert_comment(7, "other-report", "unrelated")
        await gh.comment_issue(7, "a human comment")
        comments = await gh.list_issue_comments(7)
        elsewhere = await gh.list_issue_comments(8)

    assert second.id == first.id
    assert len(comments) == 3 and elsewhere == []
    mine = [c for c in comments if marker in c.body]
    assert len(mine) == 1 and mine[0].body.startswith("build done")
    assert other.id != first.id and comment_marker("other-report") in other.body


async def test_upsert_comment_finds_marker_on_a_later_page(github_standin: GitHubStandinRepo):
    marker = comment_marker("late")
    async with github_standin.client() as gh:
        first = await gh.upsert_comment(3, marker, "v1")
        for i in range(100):
            await gh.comment_issue(3, f"noise {i}")
        second = await gh.upsert_comment(3, marker, "v2")
        comments = await gh.list_issue_comments(3)
        updated = await gh.update_comment(first.id, "plain edit")
    assert len(comments) == 101 and second.id == first.id
    assert updated.body == "plain edit"


async def test_checks_pending_then_success_then_failure(github_standin: GitHubStandinRepo):
    sha = github_standin.branch_sha("feature")
    async with github_standin.client() as gh:
        assert checks_state(await gh.check_runs(sha), await gh.combined_status(sha)) == "pending"

        github_standin.handle.set_check(github_standin.repo, sha, "lint", "in_progress", None)
        assert checks_state(await gh.check_runs(sha), await gh.combined_status(sha)) == "pending"

        github_standin.handle.set_check(github_standin.repo, sha, "lint", "completed", "success")
        runs = await gh.check_runs("feature")  # a branch name resolves to its head
        combined = await gh.combined_status(sha)
        assert [(r.name, r.status, r.conclusion, r.head_sha) for r in runs] == [("lint", "completed", "success", sha)]
        assert checks_state(runs, combined) == "success"
        assert checks_state(runs, combined, required=["lint", "tests"]) == "pending"

        github_standin.handle.set_check(github_standin.repo, sha, "tests", "completed", "failure")
        assert checks_state(await gh.check_runs(sha), await gh.combined_status(sha)) == "failure"
        # other commits are unaffected
        main = github_standin.branch_sha("main")
        assert await gh.check_runs(main) == []


async def test_commit_statuses_feed_the_verdict(github_standin: GitHubStandinRepo):
    sha = github_standin.branch_sha("feature")
    async with github_standin.client() as gh:
        await gh._json("POST", f"/repos/{gh.repo}/statuses/{sha}", json={"state": "pending", "context": "ci"})
        combined = await gh.combined_status(sha)
        assert combined.state == "pending" and combined.total_count == 1
        assert checks_state([], combined) == "pending"
        await gh._json("POST", f"/repos/{gh.repo}/statuses/{sha}", json={"state": "success", "context": "ci"})
        assert checks_state([], await gh.combined_status(sha)) == "success"
        await gh._json("POST", f"/repos/{gh.repo}/statuses/{sha}", json={"state": "error", "context": "e2e"})
        combined = await gh.combined_status(sha)
        assert combined.state == "failure" and checks_state([], combined) == "failure"


async def test_auto_green_reports_a_successful_check(github_standin: GitHubStandinRepo, tmp_path):
    handle = start_github_standin(tmp_path / "green-state", {github_standin.repo: str(github_standin.bare)},
                                  auto_green=True)
    try:
        async with GitHubClient(handle.api_url, handle.token, github_standin.repo) as gh:
            runs = await gh.check_runs("main")
            assert checks_state(runs, await gh.combined_status("main")) == "success"
    finally:
        handle.stop()


async def test_reviews_are_listed(github_standin: GitHubStandinRepo):
    async with github_standin.client() as gh:
        pull = await gh.ensure_pull("feature", "main", "t", "b")
        assert await gh.reviews(pull.number) == []
        github_standin.handle.add_review(github_standin.repo, pull.number, "CHANGES_REQUESTED", user="alice")
        github_standin.handle.add_review(github_standin.repo, pull.number, "APPROVED", user="bob")
        reviews = await gh.reviews(pull.number)
    assert [(r.state, r.user_login, r.commit_id) for r in reviews] == [
        ("CHANGES_REQUESTED", "alice", pull.head_sha), ("APPROVED", "bob", pull.head_sha)]


def _run(status: str, conclusion: str | None, name: str = "c") -> CheckRun:
    return CheckRun(id=1, name=name, head_sha="s", status=status, conclusion=conclusion)


def _combined(*states: str) -> CombinedStatus:
    statuses = [CommitStatus(context=f"s{i}", state=s) for i, s in enumerate(states)]
    overall = "failure" if {"failure", "error"} & set(states) else (
        "pending" if not states or "pending" in states else "success")
    return CombinedStatus(state=overall, sha="s", total_count=len(states), statuses=statuses)


@pytest.mark.parametrize(
    ("runs", "combined", "expected"),
    [
        ([], _combined(), "pending"),
        ([_run("completed", "success")], _combined(), "success"),
        ([_run("completed", "skipped"), _run("completed", "neutral", "d")], _combined(), "success"),
        ([_run("queued", None)], _combined(), "pending"),
        ([_run("completed", "timed_out")], _combined(), "failure"),
        ([_run("completed", "cancelled"), _run("in_progress", None, "d")], _combined(), "failure"),
        ([_run("completed", "success")], _combined("pending"), "pending"),
        ([], _combined("success"), "success"),
        ([_run("completed", "success")], _combined("success", "error"), "failure"),
    ],
)
def test_checks_state_folds_runs_and_statuses(runs, combined, expected):
    assert checks_state(runs, combined) == expected


async def test_served_counts_a_slowed_read_on_arrival_and_answered_only_once_its_answer_was_read(
        github_standin: GitHubStandinRepo):
    """tests/workflows/test_webhook_wake.py waits for ``answered`` before it comments: a comment added while a
    read is received but not yet answered would be in that answer."""
    h, comments = github_standin.handle, r"^GET /repos/.*/issues/5/comments$"
    h.slow_down("GET", r"/issues/5/comments$", 1.0)
    async with github_standin.client() as gh:
        read = asyncio.ensure_future(gh.list_issue_comments(5))
        for _ in range(200):
            if h.served(comments):
                break
            await asyncio.sleep(0.01)
        assert (h.served(comments), h.served(comments, answered=True)) == (1, 0)  # slowed: not read yet
        h.add_comment(github_standin.repo, 5, "added while the read waits", user="alice")
        assert [c.body for c in await read] == ["added while the read waits"]
    assert (h.served(comments), h.served(comments, answered=True)) == (1, 1)
