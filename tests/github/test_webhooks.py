"""The GitHub webhook receiver on its own (no Temporal): signature, size and delivery-id handling, and
the mapping of the stand-in's real deliveries (GitHub's headers and shapes) to the PR's head branch.
The receiver's ``wake`` is a recorder here; tests/workflows/test_webhook_wake.py wakes real builds."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import socket

import httpx
import pytest
from pydantic import ValidationError

from domain.config import GitHubWebhookSettings, ServiceConfig
from domain.github_webhook import pull_request_event, sign, signature_problem
from runtime.logging import configure_logging
from runtime.webhooks import WebhookReceiver
from tests.fixtures_github import STANDIN_REPO

SECRET = "sentinel-webhook-SECRET-93f1"  # the sentinel: never in a log line or an answer


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Recorder:
    def __init__(self, fail: int = 0):
        self.calls: list[tuple[str, list[int], list[str], str | None, str]] = []
        self.fail = fail

    async def __call__(self, ev, delivery):
        if self.fail:
            self.fail -= 1
            raise ConnectionError("temporal unreachable")
        self.calls.append((ev.event, ev.pr_numbers, ev.branches, ev.head_sha, delivery))
        return ["wf-1"]


@pytest.fixture
async def receiver():
    """A receiver on a free local port with a recording ``wake`` and a captured log."""
    log = io.StringIO()
    configure_logging("INFO", stream=log)
    rec = Recorder()
    settings = GitHubWebhookSettings(listen=f"127.0.0.1:{_free_port()}", secret={"kind": "env", "name": "X"},
                                     max_body_bytes=64 * 1024)
    r = WebhookReceiver(settings, SECRET, STANDIN_REPO, rec, asyncio.get_running_loop())
    r.recorder, r.logged = rec, log
    try:
        yield r
    finally:
        r.close()
        logging.basicConfig(force=True, handlers=[logging.NullHandler()])


def _url(r) -> str:
    return f"http://127.0.0.1:{r.port}/github/webhook"


def _check_run_body(branch: str = "feature", repo: str = STANDIN_REPO) -> bytes:
    return json.dumps({"action": "completed", "repository": {"full_name": repo},
                       "check_run": {"name": "ci", "head_sha": "a" * 40, "status": "completed",
                                     "conclusion": "success",
                                     "pull_requests": [{"number": 3, "head": {"ref": branch, "sha": "a" * 40}}]}
                       }).encode()


async def _post(r, body: bytes, *, event="check_run", delivery="d-1", secret: str | None = SECRET,
                signature: str | None = None) -> httpx.Response:
    headers = {"X-GitHub-Event": event, "X-GitHub-Delivery": delivery, "Content-Type": "application/json"}
    if signature is not None:
        headers["X-Hub-Signature-256"] = signature
    elif secret is not None:
        headers["X-Hub-Signature-256"] = sign(secret.encode(), body)
    async with httpx.AsyncClient() as c:
        return await c.post(_url(r), content=body, headers=headers)


def test_signature_check_is_hmac_sha256_of_the_body():
    body = b'{"zen": "Keep it logically awesome."}'
    good = sign(b"s3cret", body)
    assert good.startswith("sha256=") and signature_problem(b"s3cret", body, good) is None
    assert signature_problem(b"s3cret", body, good.upper().replace("SHA256=", "sha256=")) is None  # hex case
    assert "does not match" in signature_problem(b"other", body, good)
    assert "does not match" in signature_problem(b"s3cret", body + b" ", good)
    assert "unsigned" in signature_problem(b"s3cret", body, None)
    assert "sha256=<hex>" in signature_problem(b"s3cret", body, "sha1=" + good[7:])


def test_the_webhook_is_off_by_default_and_its_secret_is_a_credential_like_the_others():
    base = {"work_dir": "/tmp/w", "repos": {"marinskyrl_url": "file:///x", "harbor_url": "file:///y"},
            "clusters": {}, "registry": {"image_repository": "r.invalid/x", "user": {"kind": "literal_public",
                                                                                  "value": "u"},
                                          "token": {"kind": "env", "name": "T"}},
            "github": {"token": {"kind": "env", "name": "GH"}}}
    assert ServiceConfig.model_validate(base).github.webhook is None
    hook = {"secret": {"kind": "file", "path": "/run/secrets/hook"}}
    config = ServiceConfig.model_validate({**base, "github": {**base["github"], "webhook": hook}})
    assert config.github.webhook.listen == "0.0.0.0:8090" and config.github.webhook.path == "/github/webhook"
    # preflight reads it and learn_secrets registers it for redaction, like every configured credential
    assert config.credential_sources()["github.webhook.secret"].describe() == "file:/run/secrets/hook"
    for bad in ({"kind": "literal_public", "value": "oops"}, ):
        with pytest.raises(ValidationError, match="cannot hold a webhook secret"):
            GitHubWebhookSettings(secret=bad)
    with pytest.raises(ValidationError, match="HOST:PORT"):
        GitHubWebhookSettings(listen="8090", secret=hook["secret"])


def test_events_map_to_their_prs_and_head_branches():
    status = pull_request_event("status", {"sha": "b" * 40, "repository": {"full_name": "o/r"},
                                           "branches": [{"name": "gpu-rl-build/x", "commit": {"sha": "b" * 40}}]})
    assert (status.repo, status.pr_numbers, status.branches, status.head_sha) == ("o/r", [], ["gpu-rl-build/x"],
                                                                                    "b" * 40)
    review = pull_request_event("pull_request_review", {"action": "submitted", "review": {"state": "approved"},
                                                        "pull_request": {"number": 9, "head": {"ref": "x", "sha": "c"}}})
    assert (review.pr_numbers, review.branches, review.head_sha) == ([9], ["x"], "c")
    suite = pull_request_event("check_suite", {"check_suite": {"head_branch": "y", "head_sha": "d",
                                                               "pull_requests": [{"number": 4, "head": {"ref": "y"}}]}})
    assert (suite.pr_numbers, suite.branches) == ([4], ["y"])
    # A push moves a branch (the merge wait compares its head with the pin commit); a tag push wakes nothing.
    push = pull_request_event("push", {"ref": "refs/heads/x", "after": "e" * 40, "repository": {"full_name": "o/r"}})
    assert (push.repo, push.branches, push.head_sha) == ("o/r", ["x"], "e" * 40)
    assert pull_request_event("push", {"ref": "refs/tags/v1", "after": "e" * 40}) is None
    assert pull_request_event("issues", {}) is None
    # An operator's /approve-merge comment on a PR names the PR's number only (a comment has no branch).
    def comment(body: str, *, pr: bool = True, action: str = "created") -> dict:
        issue = {"number": 12, **({"pull_request": {"url": "https://api.github.com/repos/o/r/pulls/12"}} if pr else {})}
        return {"action": action, "issue": issue, "comment": {"body": body}, "repository": {"full_name": "o/r"}}
    approve = pull_request_event("issue_comment", comment("/approve-merge\nimages checked"))
    assert (approve.repo, approve.pr_numbers, approve.branches) == ("o/r", [12], [])
    assert pull_request_event("issue_comment", comment("looks good")) is None  # not a command: wakes nothing
    assert pull_request_event("issue_comment", comment("/approve-merge", pr=False)) is None  # an issue, not a PR
    assert pull_request_event("issue_comment", comment("/approve-merge", action="deleted")) is None
    # A deleted branch wakes the build whose branch it was (someone else ended its wait); a deleted tag nothing.
    deleted = pull_request_event("delete", {"ref": "gpu-rl-build/x", "ref_type": "branch", "pusher_type": "user",
                                            "repository": {"full_name": "o/r"}})
    assert (deleted.repo, deleted.pr_numbers, deleted.branches) == ("o/r", [], ["gpu-rl-build/x"])
    assert pull_request_event("delete", {"ref": "v1", "ref_type": "tag", "repository": {"full_name": "o/r"}}) is None


async def test_unsigned_bad_signature_and_oversized_bodies_are_refused_and_wake_nothing(receiver):
    body = _check_run_body()
    unsigned = await _post(receiver, body, secret=None)
    wrong = await _post(receiver, body, secret="not-the-secret", delivery="d-2")
    altered = await _post(receiver, body + b"\n", signature=sign(SECRET.encode(), body), delivery="d-3")
    big = b"{" + b" " * (64 * 1024) + b"}"
    oversized = await _post(receiver, big, delivery="d-4")
    assert [x.status_code for x in (unsigned, wrong, altered, oversized)] == [401, 401, 401, 413]
    assert receiver.recorder.calls == []
    lines = [json.loads(x) for x in receiver.logged.getvalue().splitlines()]
    refused = [x for x in lines if x["event"] == "github webhook refused"]
    assert [x["status"] for x in refused] == [401, 401, 401, 413]  # one line each, naming why
    assert "unsigned" in refused[0]["reason"] and "does not match" in refused[1]["reason"]
    assert "over 65536 bytes" in refused[3]["reason"]
    everything = receiver.logged.getvalue() + "".join(x.text for x in (unsigned, wrong, altered, oversized))
    assert SECRET not in everything and sign(SECRET.encode(), body) not in everything


async def test_a_redelivered_delivery_wakes_once_and_a_failed_one_can_be_redelivered(receiver):
    body = _check_run_body("gpu-rl-build/wf-1")
    first = await _post(receiver, body, delivery="guid-1")
    again = await _post(receiver, body, delivery="guid-1")  # GitHub's "Redeliver": same id, same body
    assert (first.status_code, again.status_code) == (202, 200) and "duplicate" in again.json()["message"]
    assert receiver.recorder.calls == [("check_run", [3], ["gpu-rl-build/wf-1"], "a" * 40, "guid-1")]

    receiver.recorder.fail = 1  # Temporal did not take the signal: GitHub shows a failed delivery
    failed = await _post(receiver, body, delivery="guid-2")
    retried = await _post(receiver, body, delivery="guid-2")
    assert (failed.status_code, retried.status_code) == (503, 202)
    assert [c[-1] for c in receiver.recorder.calls] == ["guid-1", "guid-2"]


async def test_ping_other_events_and_other_repositories_wake_nothing(receiver):
    ping = await _post(receiver, b'{"zen": "hi", "hook_id": 1}', event="ping", delivery="p-1")
    push = await _post(receiver, b'{"ref": "refs/tags/v1"}', event="push", delivery="p-2")
    other = await _post(receiver, _check_run_body(repo="someone/else"), delivery="p-3")
    not_json = await _post(receiver, b"payload=%7B%7D", delivery="p-4")
    assert [x.status_code for x in (ping, push, other, not_json)] == [200, 200, 200, 400]
    assert receiver.recorder.calls == []
    async with httpx.AsyncClient() as c:
        assert (await c.get(_url(receiver))).status_code == 405
        assert (await c.post(_url(receiver).replace("/github/webhook", "/other"), content=b"{}")).status_code == 404


async def test_the_standin_delivers_signed_github_shaped_events_for_checks_statuses_reviews_and_prs(
        receiver, github_standin):
    gh = github_standin.handle
    gh.set_webhook(_url(receiver), SECRET)
    async with github_standin.client() as client:
        pull = await client.ensure_pull("feature", "main", "bump pin", "body")
    head = github_standin.branch_sha("feature")
    gh.set_check(STANDIN_REPO, head, "ci", status="in_progress", conclusion=None)
    gh.add_review(STANDIN_REPO, pull.number, "APPROVED", user="alice")
    async with httpx.AsyncClient() as c:
        r = await c.post(f"{gh.api_url}/repos/{STANDIN_REPO}/statuses/{head}", json={"state": "success",
                         "context": "legacy"}, headers={"Authorization": f"Bearer {gh.token}"})
        assert r.status_code == 201
    gh.set_webhook(_url(receiver), "a-wrong-secret")
    gh.set_check(STANDIN_REPO, head, "ci", conclusion="success")  # signed with the wrong secret: refused

    async def delivered():
        ds = gh.webhook_deliveries()
        return ds if len(ds) == 5 and all(d["status"] is not None for d in ds) else None
    for _ in range(200):
        if deliveries := await delivered():
            break
        await asyncio.sleep(0.05)
    assert [(d["event"], d["status"]) for d in deliveries] == [
        ("pull_request", 202), ("check_run", 202), ("pull_request_review", 202), ("status", 202), ("check_run", 401)]
    assert [c[:4] for c in receiver.recorder.calls] == [
        ("pull_request", [pull.number], ["feature"], head), ("check_run", [pull.number], ["feature"], head),
        ("pull_request_review", [pull.number], ["feature"], head), ("status", [], ["feature"], head)]
    assert gh.redeliver(deliveries[1]["id"]) == 200 and len(receiver.recorder.calls) == 4  # woken once
