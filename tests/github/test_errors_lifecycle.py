"""Typed errors (auth, rate limits, transport), token hygiene, subprocess mode and persistence."""

from __future__ import annotations

import os
import socket
import traceback

import httpx
import pytest

from clients.github import (
    Forbidden,
    GitHubClient,
    GitHubError,
    GitHubUnavailable,
    RateLimited,
    Unauthorized,
)
from sandbox.github_standin import start_github_standin
from tests.fixtures_github import GitHubStandinRepo


def _assert_no_secret(exc: BaseException, secret: str) -> None:
    rendered = [str(exc), repr(exc), "".join(traceback.format_exception(exc)), repr(exc.__dict__)]
    assert all(secret not in text for text in rendered)


async def test_bad_token_is_401_and_never_shown(github_standin: GitHubStandinRepo):
    bad = "bogus-token-definitely-not-the-right-one"
    async with github_standin.client(token=bad) as gh:
        assert bad not in repr(gh) and github_standin.token not in repr(gh)
        with pytest.raises(Unauthorized) as info:
            await gh.find_pull("feature", "main")
    assert info.value.status == 401 and "Bad credentials" in str(info.value)
    _assert_no_secret(info.value, bad)


async def test_primary_rate_limit_is_typed_with_reset(github_standin: GitHubStandinRepo):
    github_standin.handle.rate_limit_next(2, status=403)
    async with github_standin.client() as gh:
        for _ in range(2):
            with pytest.raises(RateLimited) as info:
                await gh.find_pull("feature", "main")
            assert info.value.status == 403 and info.value.reset_at is not None
            assert info.value.retry_after is None and 1 <= info.value.wait_seconds() <= 61
            _assert_no_secret(info.value, github_standin.token)
        assert await gh.find_pull("feature", "main") is None  # budget spent: back to normal


async def test_secondary_rate_limit_is_429_with_retry_after(github_standin: GitHubStandinRepo):
    github_standin.handle.rate_limit_next(1, status=429)
    async with github_standin.client() as gh:
        with pytest.raises(RateLimited) as info:
            await gh.comment_issue(1, "hi")
        assert info.value.status == 429 and info.value.retry_after == 1.0
        assert await gh.list_issue_comments(1) == []  # the limited POST did not land


async def test_token_absent_from_every_error(github_standin: GitHubStandinRepo):
    errors: list[GitHubError] = []
    async with github_standin.client() as gh:
        pull = await gh.ensure_pull("conflict", "main", "t", "b")
        for call in (
            lambda: gh.get_pull(12345),
            lambda: gh.create_pull("conflict", "main", "t", "b"),
            lambda: gh.merge_pull(pull.number, "f" * 40),
            lambda: gh.merge_pull(pull.number, pull.head_sha),
            lambda: gh.check_runs("no-such-ref"),
        ):
            with pytest.raises(GitHubError) as info:
                await call()
            errors.append(info.value)
    assert sorted(e.status or 0 for e in errors) == [404, 405, 409, 422, 422]
    for exc in errors:
        _assert_no_secret(exc, github_standin.token)


async def test_transport_failure_is_unavailable_without_token():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again on exit: nothing listens there
    token = "sentinel-secret-for-transport-test"
    async with GitHubClient(f"http://127.0.0.1:{port}", token, "acme/widgets") as gh:
        with pytest.raises(GitHubUnavailable) as info:
            await gh.get_pull(1)
    assert info.value.status is None
    _assert_no_secret(info.value, token)


async def test_plain_403_is_forbidden_and_echoed_token_is_scrubbed():
    token = "ghp_echoed_secret"

    def handler(request: httpx.Request) -> httpx.Response:
        echoed = request.headers["authorization"]
        return httpx.Response(403, json={"message": f"Resource not accessible by integration ({echoed})"})

    async with GitHubClient("https://api.example.invalid", token, "acme/widgets",
                            transport=httpx.MockTransport(handler)) as gh:
        with pytest.raises(Forbidden) as info:
            await gh.get_pull(1)
    assert not isinstance(info.value, RateLimited) and "Resource not accessible" in str(info.value)
    _assert_no_secret(info.value, token)


async def test_state_survives_restart_and_token_rotates(github_standin: GitHubStandinRepo):
    async with github_standin.client() as gh:
        pull = await gh.ensure_pull("feature", "main", "t", "persisted body")
        await gh.upsert_comment(pull.number, "report", "hello")
    old_token = github_standin.token
    github_standin.handle.stop()
    github_standin.handle.stop()  # idempotent

    handle = start_github_standin(github_standin.state_dir, {github_standin.repo: str(github_standin.bare)})
    try:
        assert handle.token != old_token
        async with GitHubClient(handle.api_url, handle.token, github_standin.repo) as gh:
            again = await gh.find_pull("feature", "main")
            comments = await gh.list_issue_comments(pull.number)
        assert again is not None and again.number == pull.number and again.body == "persisted body"
        assert len(comments) == 1
        async with GitHubClient(handle.api_url, old_token, github_standin.repo) as gh:
            with pytest.raises(Unauthorized):
                await gh.get_pull(pull.number)
        assert old_token not in (github_standin.state_dir / "github.json").read_text()
        assert handle.token not in (github_standin.state_dir / "github.json").read_text()
    finally:
        handle.stop()


async def test_subprocess_mode_serves_and_stops(github_standin: GitHubStandinRepo, tmp_path):
    handle = start_github_standin(tmp_path / "sub-state", {github_standin.repo: str(github_standin.bare)},
                                  subprocess_mode=True)
    try:
        async with GitHubClient(handle.api_url, handle.token, github_standin.repo) as gh:
            pull = await gh.ensure_pull("feature", "main", "t", "b")
            handle.set_check(github_standin.repo, pull.head_sha, "ci", "completed", "success")
            result = await gh.merge_pull(pull.number, pull.head_sha)
        assert github_standin.branch_sha("main") == result.sha
    finally:
        handle.stop()
        handle.stop()
    assert handle.pid is not None
    with pytest.raises(ProcessLookupError):
        os.killpg(handle.pid, 0)  # the whole process group is gone
    async with httpx.AsyncClient() as http:
        with pytest.raises(httpx.ConnectError):
            await http.get(handle.api_url + "/repos/acme/widgets/pulls")
    assert os.environ.get("GITHUB_STANDIN_TOKEN") is None
