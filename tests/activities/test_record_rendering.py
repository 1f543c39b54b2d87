"""The record step renders operator text inert and comments on the issue in the repository `--issue-url`
names — against the GitHub stand-in and real git remotes."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError
from temporalio.testing import ActivityEnvironment

from activities.record import RecordActivities
from domain.buildset import BuildRequest, CompatibilityRequest
from sandbox.github_standin import start_github_standin
from sandbox.stack import HARBOR_SLUG, MARINSKYRL_SLUG
from tests.activities.test_record_guard import _config, _inp
from tests.fixtures_git import fresh_remotes

HOSTILE_REASON = ("Closes #1, fixes marin-community/marin#7920 — ping @marin-community/infra "
                  "<img src=https://e.vil/p.png> ![x](https://e.vil/y.png) [docs](javascript:alert(1)) "
                  "\x1b[31mred\x1b[0m")


@pytest.fixture
def github(tmp_path):
    remotes = fresh_remotes(tmp_path / "remotes")
    handle = start_github_standin(tmp_path / "github", {
        MARINSKYRL_SLUG: remotes.marinskyrl_url.removeprefix("file://"),
        HARBOR_SLUG: remotes.harbor_url.removeprefix("file://")})
    try:
        yield remotes, handle
    finally:
        handle.stop()


async def _record(tmp_path, monkeypatch, remotes, handle, issue_url: str):
    monkeypatch.setenv("X", handle.token)
    acts = RecordActivities(_config(tmp_path, remotes, api_url=handle.api_url))
    inp = _inp(remotes)
    inp.request = BuildRequest(architectures=["amd64"], variants=["standard"], issue_url=issue_url,
                               compatibility_request=CompatibilityRequest(requested_by="@alice <b>x</b>",
                                                                          reason=HOSTILE_REASON))
    return await ActivityEnvironment().run(acts.record_artifact, inp)


async def _comments(handle, repo: str, number: int) -> list[dict]:
    import httpx

    async with httpx.AsyncClient(base_url=handle.api_url,
                                 headers={"Authorization": f"Bearer {handle.token}"}) as http:
        resp = await http.get(f"/repos/{repo}/issues/{number}/comments")
        resp.raise_for_status()
        return resp.json()


async def test_cross_repository_issue_gets_one_inert_comment(tmp_path, monkeypatch, github):
    remotes, handle = github
    url = f"https://github.com/{HARBOR_SLUG}/issues/5"
    pr = await _record(tmp_path, monkeypatch, remotes, handle, url)
    assert pr.issue_comment_url and f"{HARBOR_SLUG}/issues/5" in pr.issue_comment_url
    assert await _comments(handle, MARINSKYRL_SLUG, 5) == []  # not the same number in the PR's repository
    [comment] = await _comments(handle, HARBOR_SLUG, 5)
    body = comment["body"]
    # Nothing GitHub acts on: no tags, images or links, no mentions, references or closing keywords.
    assert "<img" not in body and "<b>" not in body and "](" not in body and "\x1b" not in body
    assert not re.search(r"(?<![\w\u200b])@[A-Za-z0-9]", body)
    assert not re.search(r"(?i)\b(close[sd]?|fix(e[sd])?|resolve[sd]?)\b", body)
    assert not re.search(r"[\w/-]*#\d", body.split("Harbor dependency diff")[0].replace("#" + "\u200b", ""))
    # The operator's words are all still there to read.
    plain = body.replace("\u200b", "").replace("\\", "")
    assert "marin-community/marin#7920" in plain and "&lt;img src=https://e.vil/p.png&gt;" in plain
    # A retried record step updates the same comment instead of posting a second one.
    await _record(tmp_path, monkeypatch, remotes, handle, url)
    assert len(await _comments(handle, HARBOR_SLUG, 5)) == 1


async def test_same_repository_short_form_comments_on_the_pr_repository(tmp_path, monkeypatch, github):
    remotes, handle = github
    await _record(tmp_path, monkeypatch, remotes, handle, "#7")
    assert len(await _comments(handle, MARINSKYRL_SLUG, 7)) == 1


@pytest.mark.parametrize("bad", ["https://example.com/foo", "issue seven", "#0", "https://github.com/o/r/pull"])
def test_unclear_issue_url_is_refused_when_the_request_is_made(bad):
    with pytest.raises(ValidationError, match="--issue-url"):
        BuildRequest(architectures=["amd64"], issue_url=bad,
                     compatibility_request=CompatibilityRequest(requested_by="a", reason="b"))
