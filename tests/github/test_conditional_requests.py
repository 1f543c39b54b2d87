"""Conditional requests (issue #22 item 4 follow-up): the PR watch re-reads an idle PR with If-None-Match and
GitHub answers 304, which costs no primary rate limit.

The stand-in answers as GitHub does (weak ETag on every 200 GET, 304 without a body on a match, ETags per
token) and counts 304s apart from the requests the rate limit is charged for. The client keeps validators
and bodies per host+path+query+token fingerprint (never the token), so an idle watch makes only 304s after
its first round and still sees a check turning green or a review on the next round; when the budget runs
low the watch slows down (heartbeat, log) instead of failing.
"""

from __future__ import annotations

import logging
import pickle
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from temporalio import activity
from temporalio.testing import ActivityEnvironment

from activities.merge_gate import GateReader
from activities.record import RecordActivities
from clients.github import ConditionalCache, GitHubClient
from domain.config import OperatorSettings, ServiceConfig
from domain.github_pace import MAX_INTERVAL_S, watch_pace
from domain.models import WatchInput
from tests.fixtures_github import GitHubStandinRepo

OPS = OperatorSettings(logins=["ana"])


async def _pull(gh: GitHubClient) -> int:
    return (await gh.ensure_pull("feature", "main", "pins", "body")).number


# ---------------------------------------------------------------- the stand-in speaks GitHub's protocol


async def test_standin_answers_if_none_match_with_a_bodiless_304_and_per_token_weak_etags(github_standin):
    h, repo = github_standin.handle, github_standin.repo
    async with github_standin.client() as gh:
        number = await _pull(gh)
    other = "ghs_other_" + "1" * 30
    h.add_token(other, "someone-else", scopes=["repo"])
    url = f"/repos/{repo}/pulls/{number}"
    async with httpx.AsyncClient(base_url=h.api_url, headers={"Authorization": f"Bearer {h.token}"}) as http:
        first = await http.get(url)
        etag = first.headers["etag"]
        assert first.status_code == 200 and etag.startswith('W/"') and etag.endswith('"')
        h.request_stats(reset=True)
        again = await http.get(url, headers={"If-None-Match": etag})
        assert again.status_code == 304 and again.content == b"" and again.headers["etag"] == etag
        assert "x-ratelimit-remaining" in again.headers
        # Weak comparison, lists and "*" as RFC 9110 says; another value is a full answer.
        assert (await http.get(url, headers={"If-None-Match": etag.removeprefix("W/")})).status_code == 304
        assert (await http.get(url, headers={"If-None-Match": f'W/"nope", {etag}'})).status_code == 304
        assert (await http.get(url, headers={"If-None-Match": "*"})).status_code == 304
        assert (await http.get(url, headers={"If-None-Match": 'W/"nope"'})).status_code == 200
        # Another token's ETag for the same URL differs (GitHub's vary per Authorization).
        theirs = await http.get(url, headers={"Authorization": f"Bearer {other}", "If-None-Match": etag})
        assert theirs.status_code == 200 and theirs.headers["etag"] != etag
        # A change is a new ETag: the old one no longer matches.
        checks = f"/repos/{repo}/commits/{github_standin.branch_sha('feature')}/check-runs"
        before = (await http.get(checks)).headers["etag"]
        h.set_check(repo, github_standin.branch_sha("feature"), "ci")
        changed = await http.get(checks, headers={"If-None-Match": before})
        assert changed.status_code == 200 and changed.headers["etag"] != before
    stats = h.request_stats()
    assert stats["not_modified"] == 4 and stats["counted"] == 4 and stats["conditional"] == 7
    assert stats["requests"] == 8


async def test_standin_charges_every_answer_but_a_304_and_enforces_a_spent_budget(github_standin):
    h, repo = github_standin.handle, github_standin.repo
    h.set_rate_budget(remaining=3, limit=100)
    async with httpx.AsyncClient(base_url=h.api_url, headers={"Authorization": f"Bearer {h.token}"}) as http:
        first = await http.get(f"/repos/{repo}")
        assert first.headers["x-ratelimit-remaining"] == "2" and first.headers["x-ratelimit-limit"] == "100"
        etag = first.headers["etag"]
        for _ in range(3):
            assert (await http.get(f"/repos/{repo}", headers={"If-None-Match": etag})).status_code == 304
        assert (await http.get(f"/repos/{repo}/pulls/999")).status_code == 404  # an error is charged too
        assert (await http.get(f"/repos/{repo}")).headers["x-ratelimit-remaining"] == "0"
        spent = await http.get(f"/repos/{repo}")
        assert spent.status_code == 403 and spent.headers["x-ratelimit-remaining"] == "0"
        assert "rate limit" in spent.json()["message"]


# ---------------------------------------------------------------- the client's cache


async def test_idle_watch_rounds_are_all_304_and_a_green_check_or_a_review_is_seen_next_round(
        github_standin: GitHubStandinRepo):
    h, repo = github_standin.handle, github_standin.repo
    sha = github_standin.branch_sha("feature")
    cache = ConditionalCache()
    async with GitHubClient(github_standin.api_url, github_standin.token, repo, cache=cache) as gh:
        number = await _pull(gh)
        h.set_check(repo, sha, "ci", status="in_progress", conclusion=None)
        reader = GateReader(gh, OPS, ["ci"])
        h.request_stats(reset=True)
        first = await reader.state(number)
        round_one = h.request_stats(reset=True)
        assert first.checks == "pending" and round_one["not_modified"] == 0 and round_one["counted"] >= 5
        # Nothing changes: every read of every further round is a 304 (the required checks are cached).
        n = 5
        per_round = gh.requests
        for _ in range(n):
            before = gh.requests
            assert await reader.state(number) == first
            per_round = gh.requests - before
        idle = h.request_stats(reset=True)
        assert per_round >= 5  # PR, check runs, combined status, reviews, comments
        assert idle["requests"] == idle["not_modified"] == idle["conditional"] == n * per_round
        assert idle["counted"] == 0 and gh.not_modified == n * per_round

        h.set_check(repo, sha, "ci", conclusion="success")  # CI turns green
        green = await reader.state(number)
        assert green.checks == "success" and green != first
        changed = h.request_stats(reset=True)
        assert changed["counted"] == 1 and changed["not_modified"] == per_round - 1  # only the check runs

        h.add_review(repo, number, "APPROVED", user="ana")  # an operator approves on GitHub
        approved = await reader.state(number)
        assert approved.approvals == 1 and approved.github_approval and approved.github_approval.login == "ana"
        assert h.request_stats(reset=True)["counted"] >= 1
        assert await reader.state(number) == approved
        assert h.request_stats()["counted"] == 0


async def test_cached_answers_never_cross_tokens_and_the_cache_holds_no_token(github_standin):
    h, repo = github_standin.handle, github_standin.repo
    other = "ghs_second_" + "7" * 30
    h.add_token(other, "gpu-rl-builder-bot", scopes=["repo"])
    cache = ConditionalCache()
    async with GitHubClient(github_standin.api_url, github_standin.token, repo, cache=cache) as gh:
        number = await _pull(gh)
        await gh.get_pull(number)
        h.request_stats(reset=True)
        await gh.get_pull(number)
        assert h.request_stats(reset=True)["not_modified"] == 1
    async with GitHubClient(github_standin.api_url, other, repo, cache=cache) as gh2:
        await gh2.get_pull(number)  # the first read with this token: no validator sent, a full answer
        assert h.request_stats(reset=True) | {"rate_remaining": 0} == {
            "requests": 1, "not_modified": 0, "counted": 1, "conditional": 0, "rate_remaining": 0}
        await gh2.get_pull(number)
        assert h.request_stats(reset=True)["not_modified"] == 1
    dump = pickle.dumps(cache._entries) + repr(cache).encode() + repr(vars(cache)).encode()
    for token in (github_standin.token, other):
        assert token.encode() not in dump
    # Host, port, path and query are all part of the key; query order is not.
    a = cache.key(httpx.URL("https://api.github.com/repos/o/r/pulls?b=2&a=1"), "t")
    assert a == cache.key(httpx.URL("https://api.github.com/repos/o/r/pulls?a=1&b=2"), "t")
    for url in ("https://ghe.example/repos/o/r/pulls?a=1&b=2", "https://api.github.com:8443/repos/o/r/pulls?a=1&b=2",
                "https://api.github.com/repos/o/r/pulls?a=1&b=3", "https://api.github.com/repos/o/x/pulls?a=1&b=2"):
        assert cache.key(httpx.URL(url), "t") != a
    assert cache.key(httpx.URL("https://api.github.com/repos/o/r/pulls?a=1&b=2"), "u")[1] != a[1]


async def test_if_modified_since_is_sent_when_only_last_modified_came_back_and_the_cache_is_bounded():
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.headers.get("if-modified-since") == "Wed, 02 Dec 2026 05:00:00 GMT":
            return httpx.Response(304, headers={"x-ratelimit-remaining": "4990", "x-ratelimit-limit": "5000"})
        return httpx.Response(200, json={"permissions": {"push": True}},
                              headers={"last-modified": "Wed, 02 Dec 2026 05:00:00 GMT",
                                       "x-ratelimit-remaining": "4991", "x-ratelimit-limit": "5000"})

    cache = ConditionalCache(max_entries=1)
    async with GitHubClient("https://api.github.com", "tok", "o/r", transport=httpx.MockTransport(answer),
                            cache=cache) as gh:
        assert await gh.repo_permissions() == {"push": True}
        assert await gh.repo_permissions() == {"push": True}  # from the cached body
        assert seen[1].headers["if-modified-since"] == "Wed, 02 Dec 2026 05:00:00 GMT"
        assert "if-none-match" not in seen[1].headers
        assert gh.rate and gh.rate.remaining == 4990 and (gh.requests, gh.not_modified, gh.counted) == (2, 1, 1)
        await gh.issue(1)  # one entry at most: the repository's answer is evicted
        assert len(cache) == 1
        await gh.repo_permissions()
        assert "if-modified-since" not in seen[-1].headers


# ---------------------------------------------------------------- pacing on a low budget


def test_watch_pace_keeps_the_cadence_until_the_budget_runs_low_then_spreads_what_is_left():
    now = datetime(2026, 12, 2, 5, 0, tzinfo=UTC)
    reset = now + timedelta(minutes=30)
    assert watch_pace(5.0, limit=5000, remaining=4000, reset_at=reset, cost=5, now=now).interval_s == 5.0
    assert watch_pace(5.0, limit=None, remaining=None, reset_at=None, cost=5, now=now).reason is None
    low = watch_pace(5.0, limit=5000, remaining=600, reset_at=reset, cost=5, now=now)
    # 350 spendable (250 kept back) over 1,800 s at 5 a round: one round every ~25.7 s.
    assert low.interval_s == pytest.approx(1800 * 5 / 350) and "600 of 5000" in low.reason
    assert "every 26 s instead of 5 s" in low.reason
    spent = watch_pace(2.0, limit=5000, remaining=100, reset_at=reset, cost=0, now=now)
    assert spent.interval_s == MAX_INTERVAL_S and spent.reason
    # Plenty of time per request left: low, but no slower than configured.
    assert watch_pace(5.0, limit=5000, remaining=900, reset_at=now + timedelta(seconds=10), cost=1,
                      now=now).reason is None


# ---------------------------------------------------------------- the real watch activity


def _config(tmp_path, api_url: str, token_env: str, repo: str, **policy) -> ServiceConfig:
    return ServiceConfig.model_validate({
        "work_dir": str(tmp_path / "work"),
        "repos": {"marinskyrl_url": "file:///x", "harbor_url": "file:///y", "marinskyrl_slug": repo},
        "clusters": {},
        "registry": {"image_repository": "127.0.0.1:5000/gpu-rl", "user": {"kind": "literal_public", "value": "u"},
                     "token": {"kind": "env", "name": token_env}},
        "github": {"api_url": api_url, "token": {"kind": "env", "name": token_env}, "required_checks": ["ci"]},
        "operators": {"logins": ["ana"]},
        "policy": policy,
    })


async def test_watch_activity_polls_an_idle_pr_with_304s_across_activity_runs_and_slows_on_a_low_budget(
        github_standin: GitHubStandinRepo, tmp_path, monkeypatch, caplog):
    h, repo = github_standin.handle, github_standin.repo
    monkeypatch.setenv("GRB_GH_T", github_standin.token)
    acts = RecordActivities(_config(tmp_path, github_standin.api_url, "GRB_GH_T", repo,
                                    merge_watch_interval_s=0.05))
    async with github_standin.client() as gh:
        number = await _pull(gh)
    h.set_check(repo, github_standin.branch_sha("feature"), "ci", status="in_progress", conclusion=None)
    beats: list = []
    env = ActivityEnvironment()
    sha = github_standin.branch_sha("feature")

    def looks() -> list[dict]:
        """One entry per look: the background beat repeats a look's details (same ``look`` number)."""
        by_look = {b["github"]["look"]: b["github"] for b in beats if isinstance(b, dict) and "github" in b}
        return [by_look[n] for n in sorted(by_look)]

    def beat(*details):
        beats.append(details[0] if details else None)
        # The third idle round has been seen: CI finishes, and the watch returns at its next look (an
        # event, not a 0.5 s window that a loaded machine may fill with one round).
        if len(looks()) == 3:
            h.set_check(repo, sha, "ci", status="completed", conclusion="success")

    env.on_heartbeat = beat
    h.request_stats(reset=True)
    first = await env.run(acts.watch_pull_request, WatchInput(pr_number=number, last=None, return_after_s=60))
    cold = h.request_stats(reset=True)
    assert first.checks == "pending" and cold["not_modified"] == 0

    # The next watch (a new activity run on the same worker) starts warm: only 304s while nothing changes.
    beats.clear()
    again = await env.run(acts.watch_pull_request, WatchInput(pr_number=number, last=first, return_after_s=120))
    assert again != first and again.checks == "success"
    rounds = looks()
    assert len(rounds) == 4  # three idle looks, then the one that saw CI finish
    idle = rounds[:3]
    assert sum(r["requests"] for r in idle) >= 2 * cold["requests"]
    # Branch protection, re-read by each activity's gate reader (a 403, no admin), is the one counted read.
    assert idle[0]["requests"] - idle[0]["not_modified"] == 1
    assert all(r["not_modified"] == r["requests"] for r in idle[1:])

    # A low budget: the watch slows down, says so in its heartbeat and log, and still returns in time.
    h.set_rate_budget(remaining=300, limit=5000, reset_in_s=1800, enforce=False)
    beats.clear()
    with caplog.at_level(logging.WARNING):
        # return_after_s leaves the first look time to finish on a loaded machine before the cut sleep.
        slow = await env.run(acts.watch_pull_request, WatchInput(pr_number=number, last=again, return_after_s=5))
    assert slow == again
    slowed = looks()
    # The new watch's first round paid for one read (branch protection: a 403 is never cached).
    assert slowed and slowed[0]["slowed"] and "299 of 5000 requests left" in slowed[0]["slowed"]
    assert slowed[0]["interval_s"] >= 30 and slowed[0]["rate_remaining"] == 299
    assert len(slowed) == 2  # one look, a sleep cut at return_after_s, the last look
    assert sum("rate limit low" in r.getMessage() for r in caplog.records) == 1  # said once, not every round
    assert github_standin.token not in caplog.text and github_standin.token not in repr(beats)


async def test_watch_waits_out_a_spent_budget_and_carries_on(github_standin: GitHubStandinRepo, tmp_path,
                                                             monkeypatch, caplog):
    h, repo = github_standin.handle, github_standin.repo
    monkeypatch.setenv("GRB_GH_T", github_standin.token)
    acts = RecordActivities(_config(tmp_path, github_standin.api_url, "GRB_GH_T", repo))
    async with github_standin.client() as gh:
        number = await _pull(gh)
    # The warning is read by a handler on the activity logger itself: an earlier test of the session may
    # have configured logging (the worker's structlog set-up) so that records no longer reach caplog's root
    # handler. The window resets 3 s after it is set (1 s could pass before the first request under load).
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logger = activity.logger.logger
    caplog.set_level(logging.WARNING, logger=logger.name)
    logger.addHandler(handler)
    try:
        h.set_rate_budget(remaining=0, limit=5000, reset_in_s=3)
        state = await ActivityEnvironment().run(acts.watch_pull_request,
                                                WatchInput(pr_number=number, last=None, return_after_s=120))
    finally:
        logger.removeHandler(handler)
    assert state.checks == "pending"
    assert any("rate limit hit" in r.getMessage() for r in records), [r.getMessage() for r in records]
