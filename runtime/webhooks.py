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

Served on uvicorn from its own thread (runtime/asgi_thread.py: a slow client holds a socket, not a
thread); each accepted delivery is handed to the worker's event loop. Answers: 202 accepted (JSON: who was woken), 200 ping / duplicate delivery /
an event that wakes nobody, 401 unsigned or bad signature, 413 body over ``max_body_bytes`` (unread),
400 malformed, 404 other paths, 405 other methods, 503 Temporal did not take the signal (GitHub shows
the delivery failed; a redelivery is processed again). Every refusal is one log line naming why.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from temporalio.service import RPCError, RPCStatusCode

from domain.config import GitHubWebhookSettings, ServiceConfig, split_address
from domain.github_webhook import PullRequestEvent, pull_request_event, signature_problem
from domain.models import GitHubWake
from domain.redact import redact
from runtime import search_attributes as sa
from runtime.asgi_thread import ASGIThread, BodyTooLarge, read_body
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
    """Verifies, de-duplicates and maps deliveries; ``wake`` runs on ``loop``. ``close()`` stops it.

    Served by uvicorn (runtime/asgi_thread.py) from its own thread and event loop: a slow client holds a
    socket, not a thread, so forty clients sending a byte a second starve nobody. Its line and headers
    must arrive within ``read_timeout_s``, a keep-alive connection idle for ``idle_timeout_s`` is closed,
    at most ``max_connections`` deliveries are handled at once (503 beyond), and the body is read up to
    ``max_body_bytes`` (413, unread, on its declared length) within ``read_timeout_s`` (408), then its
    signature is checked before a byte of it is parsed (401)."""

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
        self._handlers = threading.BoundedSemaphore(settings.max_connections)
        self.log = get_logger("webhooks")
        host, port = split_address(settings.listen)
        self._http = ASGIThread(self._app, host, port, "github-webhooks", header_timeout_s=settings.read_timeout_s,
                                keep_alive_s=max(1, int(settings.idle_timeout_s)))

    @property
    def port(self) -> int:
        return self._http.port

    def close(self) -> None:
        self._http.close()

    # -- one delivery (on the server's own loop)

    def refuse(self, status: int, why: str, **fields: Any) -> tuple[int, dict[str, Any]]:
        self.log.warning("github webhook refused", status=status, reason=why, **fields)
        return status, {"message": why}

    async def handle(self, headers: Mapping[str, str], body: bytes) -> tuple[int, dict[str, Any]]:
        event = headers.get("x-github-event") or ""
        delivery = headers.get("x-github-delivery") or ""
        ids = {"github_event": event[:40], "delivery": delivery[:80]}
        if problem := signature_problem(self._secret, body, headers.get("x-hub-signature-256")):
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
            woken = await asyncio.wait_for(asyncio.wrap_future(future), SIGNAL_TIMEOUT_S)
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

    async def _app(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] != self.settings.path:
            return await _answer(send, 404, {"message": "not found"})
        if scope["method"] != "POST":
            return await _answer(send, 405, {"message": "POST only"})
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        limit = self.settings.max_body_bytes
        declared = headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            status, payload = self.refuse(413, f"body of {declared[:20]} bytes is over {limit} bytes",
                                          github_event=headers.get("x-github-event", "")[:40])
            return await _answer(send, status, payload)  # unread: the connection is closed
        if not self._handlers.acquire(blocking=False):
            status, payload = self.refuse(503, f"busy: {self.settings.max_connections} deliveries in progress "
                                               "(github.webhook.max_connections)")
            return await _answer(send, status, payload)
        try:
            try:
                body = await read_body(receive, limit, self.settings.read_timeout_s)
            except BodyTooLarge:
                status, payload = self.refuse(413, f"body is over {limit} bytes")
                return await _answer(send, status, payload)
            except (TimeoutError, ConnectionError) as e:
                self.refuse(408, f"body not received within {self.settings.read_timeout_s:g} s "
                                 f"(github.webhook.read_timeout_s): {type(e).__name__}")
                return await _answer(send, 408, {"message": "body not received in time"})
            try:
                status, payload = await self.handle(headers, body)
            except Exception as e:  # a bug here: one line, and GitHub shows the delivery failed
                status, payload = self.refuse(500, f"receiver error: {type(e).__name__}")
            return await _answer(send, status, payload)
        finally:
            self._handlers.release()


async def _answer(send, status: int, payload: dict[str, Any]) -> None:
    data = json.dumps(payload).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    if status in (404, 405, 408, 413):
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})
