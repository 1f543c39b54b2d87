"""The GitHub token is bound to github.api_url: a ``Link: rel="next"`` naming another host is refused
and no request (so no Authorization header) reaches that host (issue #21 item 2)."""

from __future__ import annotations

import httpx
import pytest

from clients.github import GitHubClient, GitHubError


async def test_a_next_link_to_another_host_is_not_followed_with_the_token():
    seen: list[tuple[str, str | None]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.host, request.headers.get("authorization")))
        return httpx.Response(200, json=[{"id": 1}],
                              headers={"link": '<https://collector.example/steal?page=2>; rel="next"'})

    async with GitHubClient("https://api.github.test", "sentinel-host-binding-token-0001", "o/r",
                            transport=httpx.MockTransport(handler)) as gh:
        with pytest.raises(GitHubError, match="refusing to send the GitHub token to collector.example"):
            await gh._paged("/repos/o/r/issues/1/comments")
    assert [host for host, _ in seen] == ["api.github.test"]  # 0 requests to the other host


async def test_same_host_pages_are_followed():
    pages = {1: '<https://api.github.test/repos/o/r/x?page=2>; rel="next"', 2: ""}

    def handler(request: httpx.Request) -> httpx.Response:
        page = int(request.url.params.get("page", 1))
        return httpx.Response(200, json=[{"page": page}], headers={"link": pages[page]})

    async with GitHubClient("https://api.github.test", "t", "o/r", transport=httpx.MockTransport(handler)) as gh:
        assert await gh._paged("/repos/o/r/x") == [{"page": 1}, {"page": 2}]
