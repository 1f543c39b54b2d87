"""GitHub webhook receiver: a check, status, review, PR or branch-deletion event wakes the build on that PR.

Why: the merge wait's PR watch polls GitHub (``policy.merge_watch_interval_s``, 2 s while an
authorization waits for green); where GitHub can reach the worker, a delivery makes the watch read
again at once. Polling stays the fallback (a lost delivery, a receiver that is down) and the only path
without ``[github.webhook]``. The payload is never trusted as gate state: the signal only wakes the
watch, which reads checks and reviews with its normal reader.

Which build: a PR's head branch is the build's branch, ``repos.build_branch(<pipeline workflow id>)``
(the record step opens the PR from it), so the receiver lists the running pipelines in their merge
wait on this task queue (visibility: ``BuildStage``) and signals each whose branch the event names.
An ``/approve-merge`` comment names only its PR's number: each build in its merge wait gets it, and
the workflow whose PR it is wakes (the others ignore another number).

Served like the health probes (``http.server`` in a daemon thread); each accepted delivery is handed to
the worker's event loop. Answers: 202 accepted (JSON: who was woken), 200 ping / duplicate delivery /
an event that wakes nobody, 401 unsigned or bad signature, 413 body over ``max_body_bytes`` (unread),
400 malformed, 404 other paths, 405 other methods, 503 Temporal did not take the signal (GitHub shows
the delivery failed; a redelivery is processed again). Every refusal is one log line naming why.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from temporalio.service import RPCError, RPCStatusCode

from domain.config import GitHubWebhookSettings, ServiceConfig, split_address
from domain.github_webhook import PullRequestEvent, pull_request_event, signature_problem
from domain.models import GitHubWake
from domain.redact import redact
from runtime import search_attributes as sa
from runtime.http_thread import BackgroundHTTPServer, TimedRequestHandler
from runtime.logging import get_logger

SEEN_DELIVERIES = 10_000  # delivery ids remembered (GitHub redelivers by id, days later at most)
SIGNAL_TIMEOUT_S = 15.0

Waker = Callable[[PullRequestEvent, str], Awaitable[list[str]]]


def awaiting_merge_query(task_queue: str) -> str:
    """The pipelines an event may wake: running, on this service's task queue, in their merge wait."""
    return (f"WorkflowType = 'BuildPipelineWorkflow' AND ExecutionStatus = 'Running' AND "
            f"TaskQueue = '{task_queue}' AND {sa.STAGE.name} = 'awaiting_merge'")


def pipeline_waker(client, config: ServiceConfig) -> Waker:
    """Signal ``github_changed`` to every pipeline in its merge wait whose build branch the event names."""
    async def wake(ev: PullRequestEvent, delivery: str) -> list[str]:
        from workflows.pipeline import BuildPipelineWorkflow

        woken = []
        branches = set(ev.branches)
        # An /approve-merge comment names its PR's number, not its branch: every build in its merge wait is
        # told the number, and only the one whose PR it is wakes (the workflow ignores other numbers).
        by_number = not branches and bool(ev.pr_numbers)
        async for wf in client.list_workflows(awaiting_merge_query(config.temporal.task_queue)):
            if not by_number and config.repos.build_branch(wf.id) not in branches:
                continue
            try:
                for number in ev.pr_numbers or [None]:  # the workflow ignores numbers that are not its PR's
                    await client.get_workflow_handle(wf.id).signal(
                        BuildPipelineWorkflow.github_changed,
                        GitHubWake(event=ev.event, delivery=delivery, pr_number=number, head_sha=ev.head_sha))
            except RPCError as e:
                if e.status == RPCStatusCode.NOT_FOUND:  # it ended since it was listed: nothing to wake
                    continue
                raise
            woken.append(wf.id)
        return woken
    return wake


class WebhookReceiver:
    """Verifies, de-duplicates and maps deliveries; ``wake`` runs on ``loop``. ``close()`` stops it."""

    def __init__(self, settings: GitHubWebhookSettings, secret: str, repo: str, wake: Waker,
                 loop: asyncio.AbstractEventLoop):
        self.settings = settings
        self._secret = secret.encode()
        self._repo = repo.lower()
        self._wake = wake
        self._loop = loop
        self._lock = threading.Lock()
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._inflight: set[str] = set()
        self.log = get_logger("webhooks")
        host, port = split_address(settings.listen)
        self._http = BackgroundHTTPServer((host, port), _handler(self), "github-webhooks",
                                          idle_timeout_s=settings.idle_timeout_s,
                                          read_timeout_s=settings.read_timeout_s,
                                          max_connections=settings.max_connections)

    @property
    def port(self) -> int:
        return self._http.port

    def close(self) -> None:
        self._http.close()

    # -- one delivery (called on the HTTP thread)

    def refuse(self, status: int, why: str, **fields: Any) -> tuple[int, dict[str, Any]]:
        self.log.warning("github webhook refused", status=status, reason=why, **fields)
        return status, {"message": why}

    def handle(self, headers, body: bytes) -> tuple[int, dict[str, Any]]:
        event = headers.get("X-GitHub-Event") or ""
        delivery = headers.get("X-GitHub-Delivery") or ""
        ids = {"github_event": event[:40], "delivery": delivery[:80]}
        if problem := signature_problem(self._secret, body, headers.get("X-Hub-Signature-256")):
            return self.refuse(401, problem, **ids)
        if not event or not delivery:
            return self.refuse(400, "missing X-GitHub-Event or X-GitHub-Delivery", **ids)
        if event == "ping":
            return 200, {"message": "pong"}
        try:
            payload = json.loads(body)
        except ValueError:
            return self.refuse(400, "body is not JSON (content type application/json expected)", **ids)
        ev = pull_request_event(event, payload) if isinstance(payload, dict) else None
        if ev is None:
            return 200, {"message": f"event {event[:40]} wakes nothing"}
        if ev.repo.lower() != self._repo:
            return 200, {"message": f"repository {ev.repo[:100]} is not {self._repo}: nothing to wake"}
        with self._lock:
            if delivery in self._seen or delivery in self._inflight:
                return 200, {"message": "duplicate delivery: already processed", "delivery": delivery}
            self._inflight.add(delivery)
        future = asyncio.run_coroutine_threadsafe(self._wake(ev, delivery), self._loop)
        try:
            woken = future.result(SIGNAL_TIMEOUT_S)
        except Exception as e:
            future.cancel()  # Temporal unreachable, a stopped loop: GitHub shows it failed; redeliver works
            with self._lock:
                self._inflight.discard(delivery)
            return self.refuse(503, f"could not signal the build: {type(e).__name__}: {redact(str(e))[:200]}", **ids)
        with self._lock:
            self._inflight.discard(delivery)
            self._seen[delivery] = None
            while len(self._seen) > SEEN_DELIVERIES:
                self._seen.popitem(last=False)
        if woken:
            self.log.info("github webhook woke the merge wait", **ids, workflows=woken, prs=ev.pr_numbers)
        return 202, {"woken": woken, "event": event, "delivery": delivery}


def _handler(receiver: WebhookReceiver) -> type[TimedRequestHandler]:
    class Handler(TimedRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body in two writes: no 40 ms delayed-ACK stall

        def _send(self, status: int, payload: dict[str, Any], *, close: bool = False) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if close:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            if self.path.split("?")[0] != receiver.settings.path:
                self._send(404, {"message": "not found"}, close=True)
                return
            try:
                length = int(self.headers.get("Content-Length") or "")
            except ValueError:
                status, payload = receiver.refuse(411, "no Content-Length")
                self._send(status, payload, close=True)
                return
            limit = receiver.settings.max_body_bytes
            if length > limit or length < 0:
                status, payload = receiver.refuse(413, f"body of {length} bytes is over {limit} bytes",
                                                  github_event=(self.headers.get("X-GitHub-Event") or "")[:40])
                self._send(status, payload, close=True)  # unread: the connection is closed
                return
            try:
                body = self.read_body(length)  # within read_timeout_s, or the connection is cut
            except OSError as e:  # cut at the deadline, timed out or gone: nothing to answer on
                receiver.refuse(408, f"body not received within {receiver.settings.read_timeout_s:g} s "
                                f"(github.webhook.read_timeout_s): {type(e).__name__}")
                self.close_connection = True
                return
            try:
                status, payload = receiver.handle(self.headers, body)
            except Exception as e:  # a bug here: one line, and GitHub shows the delivery failed
                status, payload = receiver.refuse(500, f"receiver error: {type(e).__name__}")
            self._send(status, payload)

        def do_GET(self) -> None:  # noqa: N802
            self._send(405, {"message": "POST only"}, close=True)

        do_PUT = do_PATCH = do_DELETE = do_GET

        def log_message(self, *_args) -> None:  # our own one line per refusal instead
            pass

    return Handler
