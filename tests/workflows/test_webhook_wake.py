"""GitHub webhooks wake the merge wait (issue #22.4): real Temporal dev server, the worker's own webhook
receiver (worker._webhooks) and real record activities against the GitHub stand-in, which delivers
signed webhooks as GitHub does.

Causality, not timing: the PR watch polls every 120 s here, and each test waits until the authorized
watch has read GitHub (pending) before CI turns green, so a merge that follows promptly can only have
come from a webhook. The history shows it: the ``github_changed`` signal, then the watch that saw green,
then the merge. Without a working webhook the watch would return only after 120 s and the history would
hold no signal, failing the test."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
import socket
import urllib.parse
import uuid

import git
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.common import SearchAttributePair, TypedSearchAttributes

from domain.buildset import BuildRequest, CompatibilityRequest
from domain.config import ServiceConfig
from domain.models import (
    GitHubWake,
    MergeAuthorization,
    MergeWaitState,
    PipelineInput,
    PipelineReport,
    PullRequestInfo,
)
from domain.redact import REDACTED, redact
from runtime import search_attributes as sa
from runtime.logging import configure_logging
from tests.fixtures_github import STANDIN_REPO
from tests.workflows.history_digest import history_digest
from worker import _webhooks, build_worker
from workflows.pipeline import BuildPipelineWorkflow

SECRET = "sentinel-webhook-SECRET-5e2d"
CHECK_RUNS = r"^GET /repos/.*/check-runs$"
SLOW_POLL_S = 120.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(tmp_path, temporal, gh) -> ServiceConfig:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "github-token").write_text(gh.token)
    (secrets / "webhook-secret").write_text(SECRET + "\n")
    (secrets / "registry-token").write_text("registry-token-unused")
    bare = f"file://{gh.bare}"
    return ServiceConfig.model_validate({
        "work_dir": str(tmp_path / "work"),
        "temporal": {"address": temporal.address, "namespace": temporal.namespace,
                     "task_queue": f"tq-webhook-{uuid.uuid4().hex[:8]}"},
        "repos": {"marinskyrl_url": bare, "harbor_url": bare, "marinskyrl_slug": STANDIN_REPO},
        "clusters": {},
        "registry": {"image_repository": "registry.invalid/gpu-rl", "user": {"kind": "literal_public", "value": "u"},
                     "token": {"kind": "file", "path": str(secrets / "registry-token")}},
        "github": {"api_url": gh.api_url, "token": {"kind": "file", "path": str(secrets / "github-token")},
                   "webhook": {"listen": f"127.0.0.1:{_free_port()}",
                               "secret": {"kind": "file", "path": str(secrets / "webhook-secret")}}},
        "operators": {"logins": ["tester"]},
        "policy": {"merge_watch_interval_s": SLOW_POLL_S, "merge_watch_authorized_interval_s": SLOW_POLL_S},
    })


async def _until(pred, what: str, attempts: int = 600, handle=None):
    """Poll ``pred`` (bounded); on timeout, with ``handle``, the message carries the build's history digest:
    a wait that never came is diagnosed from what the workflow did, not guessed at."""
    for _ in range(attempts):
        if value := await pred():
            return value
        await asyncio.sleep(0.05)
    digest = f"\n{await history_digest(handle)}" if handle is not None else ""
    raise AssertionError(f"timed out waiting for {what}{digest}")


class Build:
    """A pipeline started in its merge wait on a PR of its own build branch (what the record step opens)."""

    def __init__(self, client, config: ServiceConfig, gh, handle, pr: PullRequestInfo):
        self.client, self.config, self.gh, self.handle, self.pr = client, config, gh, handle, pr

    @classmethod
    async def start(cls, client, config: ServiceConfig, gh) -> Build:
        wid = f"webhook-{uuid.uuid4().hex[:10]}"
        branch = config.repos.build_branch(wid)
        git.Repo(gh.bare).git.branch(branch, "feature")
        async with gh.client() as c:
            pull = await c.ensure_pull(branch, "main", "pin images", "webhook test")
        pr = PullRequestInfo(number=pull.number, url=pull.html_url or "", head_sha=pull.head_sha)
        req = BuildRequest(architectures=["amd64"], variants=["standard"],
                           compatibility_request=CompatibilityRequest(requested_by="test", reason="webhooks"))
        rep = PipelineReport(workflow_id=wid, status="awaiting_merge", request=req, pull_request=pr)
        handle = await client.start_workflow(
            BuildPipelineWorkflow.run, PipelineInput(request=req, request_id=wid, resume=MergeWaitState(report=rep)),
            id=wid, task_queue=config.temporal.task_queue,
            # What a continued merge wait inherits from the run before it (the receiver lists by it).
            search_attributes=TypedSearchAttributes([SearchAttributePair(sa.STAGE, "awaiting_merge")]))
        return cls(client, config, gh, handle, pr)

    async def reads(self, n: int) -> None:
        """Wait until the PR watch has read the checks ``n`` times in all (sequential watches): answers read
        from the stand-in's state, so a check changed after this returns is not in any of them."""
        async def done():
            return self.gh.handle.served(CHECK_RUNS, answered=True) >= n
        await _until(done, f"{n} check reads")

    async def authorize_and_wait_for_the_slow_poll(self) -> None:
        """Approve while CI is pending; return once the authorized watch has read GitHub and sleeps 120 s."""
        await self.reads(2)  # the resumed run's first look, then the watch that waits for a change
        before = self.gh.handle.served(CHECK_RUNS)
        ack = await self.handle.execute_update(BuildPipelineWorkflow.approve_merge, MergeAuthorization(by="tester"))
        assert "accepted and queued" in ack
        await self.reads(before + 2)  # the re-read on the authorization, then the authorized watch's first look

    async def watch_sleeping(self) -> None:
        """Wait until the watch that waits for a change has read all of GitHub and sleeps: this PR's comments
        were answered twice (the first look's, then the second watch's). Comments are the last thing a watch
        reads of an open PR (activities/merge_gate.py ``GateReader.state``), so a comment added after this
        returns can reach the build only through a wake (or the 120 s poll). Counting check reads alone is not
        enough (a comment added before the watch's comments read is seen by that watch, with no wake), nor is
        a heartbeat: every activity heartbeats ``null`` in the background from its start (activities/common.py
        ``_heartbeating``), before it has read anything. Waiting on that heartbeat let this test comment while
        the watch was still reading; when the webhook's wake then took longer than the watch's remaining reads
        (full suite runs), that watch saw the comment and the build merged with no watch after the wake."""
        comments = rf"^GET /repos/{STANDIN_REPO}/issues/{self.pr.number}/comments$"

        async def done():
            return self.gh.handle.served(comments, answered=True) >= 2
        await _until(done, "the watch sleeping after its first read")

    async def events(self):
        return [e async for e in self.handle.fetch_history_events()]


def _signals(events) -> list[dict]:
    return [json.loads(e.workflow_execution_signaled_event_attributes.input.payloads[0].data)
            for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
            and e.workflow_execution_signaled_event_attributes.signal_name == "github_changed"]


def _scheduled(events, name: str) -> list[int]:
    return [e.event_id for e in events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
            and e.activity_task_scheduled_event_attributes.activity_type.name == name]


async def _delivered(gh, event: str, n: int = 1) -> list[dict]:
    async def done():
        ds = [d for d in gh.handle.webhook_deliveries() if d["event"] == event and d["status"] is not None]
        return ds if len(ds) >= n else None
    return await _until(done, f"{n} {event} deliveries answered")


@pytest.fixture
def logs():
    out = io.StringIO()
    configure_logging("INFO", stream=out)
    yield out
    logging.basicConfig(force=True, handlers=[logging.NullHandler()])


async def test_a_check_turning_green_merges_via_the_webhook_not_the_poll_and_a_redelivery_wakes_once(
        tmp_path, temporal_dev_server, temporal_client, github_standin, logs):
    config = _config(tmp_path, temporal_dev_server, github_standin)
    gh = github_standin.handle
    async with build_worker(temporal_client, config, graceful_shutdown_s=5), \
            _webhooks(temporal_client, config) as receiver:
        assert redact(f"x {SECRET} y") == f"x {REDACTED} y"  # read at start and registered for redaction
        build = await Build.start(temporal_client, config, github_standin)
        gh.set_webhook(f"http://127.0.0.1:{receiver.port}{config.github.webhook.path}", SECRET)  # after the PR opened
        await build.authorize_and_wait_for_the_slow_poll()
        desc = await build.handle.describe()  # pending watch, heartbeats and all: no secret
        gh.set_check(STANDIN_REPO, build.pr.head_sha, "ci", conclusion="success")
        final: PipelineReport = await asyncio.wait_for(build.handle.result(), 300)  # a hang guard, not a timing
        (check_run,) = await _delivered(github_standin, "check_run")
        assert gh.redeliver(check_run["id"]) == 200  # GitHub's "Redeliver": same X-GitHub-Delivery
        events = await build.events()

    assert final.status == "merged" and "authorized by tester" in final.message
    assert check_run["status"] == 202 and check_run["payload"]["check_run"]["pull_requests"][0]["number"] == build.pr.number
    # (the merge's own pull_request "closed" delivery finds the build merging or done: it wakes nothing)
    signals = [s for s in _signals(events) if s["event"] == "check_run"]
    assert [(s["delivery"], s["pr_number"]) for s in signals] == [(check_run["id"], build.pr.number)]  # redelivery: no more
    signalled = next(e.event_id for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED)
    watches, (merge,) = _scheduled(events, "watch_pull_request"), _scheduled(events, "merge_pull_request")
    after = [w for w in watches if signalled < w < merge]
    assert len(after) == 1, "the merge follows the watch the webhook started, not the 120 s poll"
    assert gh.served(CHECK_RUNS) >= 5  # reads: 2 before, 2 on the authorization, 1 after the webhook (+ merge's)

    history = b"".join(e.SerializeToString() for e in events)
    # Raw, URL-encoded and base64 (standard and URL-safe) forms, in history, describe and logs.
    forms = {SECRET, urllib.parse.quote(SECRET, safe=""), base64.b64encode(SECRET.encode()).decode(),
             base64.urlsafe_b64encode(SECRET.encode()).decode()}
    for form in forms:
        assert form.encode() not in history and form not in str(desc.raw_description), form
        assert form not in logs.getvalue(), form
    assert "github webhook woke the merge wait" in logs.getvalue()


async def test_a_bad_signature_is_refused_with_401_and_wakes_nothing(
        tmp_path, temporal_dev_server, temporal_client, github_standin, logs):
    config = _config(tmp_path, temporal_dev_server, github_standin)
    gh = github_standin.handle
    async with build_worker(temporal_client, config, graceful_shutdown_s=5), \
            _webhooks(temporal_client, config) as receiver:
        url = f"http://127.0.0.1:{receiver.port}{config.github.webhook.path}"
        build = await Build.start(temporal_client, config, github_standin)
        gh.set_webhook(url, "not-the-webhook-secret")
        await build.authorize_and_wait_for_the_slow_poll()
        # A wake naming another PR number (a branch reused by another PR) is ignored by the workflow.
        await build.handle.signal(BuildPipelineWorkflow.github_changed, GitHubWake(
            event="pull_request", delivery="other-pr", pr_number=build.pr.number + 100))

        async def handled():
            events = await build.events()
            sig = max(e.event_id for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED)
            done = [e for e in events if e.event_id > sig and e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED]
            return [e for e in events if e.event_id > sig] if done else None
        after_other = await _until(handled, "the signal's workflow task")
        assert not [e for e in after_other if e.event_type in (
            EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED, EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED)]
        reads = gh.served(CHECK_RUNS)
        gh.set_check(STANDIN_REPO, build.pr.head_sha, "ci", conclusion="success")
        (refused,) = await _delivered(github_standin, "check_run")
        # The receiver answers only after the signal was taken: nothing was signalled, and nothing read again.
        assert refused["status"] == 401 and [x["delivery"] for x in _signals(await build.events())] == ["other-pr"]
        assert gh.served(CHECK_RUNS) == reads and (await build.handle.describe()).status.name == "RUNNING"

        gh.set_webhook(url, SECRET)  # the secret fixed: the next event (a review) wakes the build
        gh.add_review(STANDIN_REPO, build.pr.number, "COMMENTED", user="alice")
        final: PipelineReport = await asyncio.wait_for(build.handle.result(), 300)
        events = await build.events()

    assert final.status == "merged"
    assert [s["event"] for s in _signals(events)] == ["pull_request", "pull_request_review"]  # ours, then GitHub's
    refusals = [json.loads(x) for x in logs.getvalue().splitlines() if "github webhook refused" in x]
    # The service's own comment acknowledging the approval is delivered (and refused) too, before the check.
    assert [(r["status"], r["github_event"]) for r in refusals] == [(401, "issue_comment"), (401, "check_run")]
    assert all("does not match" in r["reason"] for r in refusals) and SECRET not in logs.getvalue()


async def test_an_approve_merge_comment_wakes_only_its_own_build_through_the_webhook(
        tmp_path, temporal_dev_server, temporal_client, github_standin, logs):
    """CI is green and nobody has authorized yet; the watch sleeps 120 s. A configured operator's
    ``/approve-merge`` comment on the PR reaches the receiver as ``issue_comment``, which names only the
    PR's number: the build it belongs to merges after a watch started by that wake, and another build in
    its merge wait is told the number and ignores it (no watch restarted)."""
    config = _config(tmp_path, temporal_dev_server, github_standin)
    gh = github_standin.handle
    async with build_worker(temporal_client, config, graceful_shutdown_s=5), \
            _webhooks(temporal_client, config) as receiver:
        # Green before either build looks (both build branches start at `feature`): each build's first look
        # sees green and its watch then waits for a change: exactly 2 reads each, then 120 s of sleep.
        gh.set_check(STANDIN_REPO, git.Repo(github_standin.bare).commit("feature").hexsha, "ci", conclusion="success")
        build = await Build.start(temporal_client, config, github_standin)
        other = await Build.start(temporal_client, config, github_standin)
        await build.reads(4)  # both builds' first look and their watches waiting for a change
        # ... and both watches have read all of GitHub (checks, reviews, comments) and sleep: a comment added
        # between a watch's checks read and its comments read is seen by that watch, with no wake (failed so
        # once in a full suite run at load 10).
        await build.watch_sleeping()
        await other.watch_sleeping()
        gh.set_webhook(f"http://127.0.0.1:{receiver.port}{config.github.webhook.path}", SECRET)
        other_before = len(_scheduled(await other.events(), "watch_pull_request"))
        gh.add_comment(STANDIN_REPO, build.pr.number, "/approve-merge\nimages checked", user="tester")
        final: PipelineReport = await asyncio.wait_for(build.handle.result(), 300)  # a hang guard, not a timing
        (delivery,) = await _delivered(github_standin, "issue_comment")
        events, other_events = await build.events(), await other.events()
        await other.handle.terminate("test over")

    assert final.status == "merged" and delivery["status"] == 202
    (wake,) = [s for s in _signals(events) if s["event"] == "issue_comment"]
    assert (wake["delivery"], wake["pr_number"]) == (delivery["id"], build.pr.number)
    signalled = next(e.event_id for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED)
    watches, (merge,) = _scheduled(events, "watch_pull_request"), _scheduled(events, "merge_pull_request")
    assert len([w for w in watches if signalled < w < merge]) == 1, "merged after the wake's watch, not the 120 s poll"
    # The other build was told the number and ignored it: no watch restarted there.
    assert [s["pr_number"] for s in _signals(other_events)] == [build.pr.number]
    assert len(_scheduled(other_events, "watch_pull_request")) == other_before
