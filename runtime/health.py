"""Worker health for Kubernetes probes: Temporal connectivity and poller state, over plain HTTP.

Why these checks: a worker is useful only while the server answers and it is really polling its task
queue, so readiness asks the server itself (gRPC health check, then ``DescribeTaskQueue``: is this
worker's identity among the workflow and activity pollers?). Liveness only says the worker's event
loop still turns (a drain after SIGTERM is still live): restarting a pod never fixes an unreachable
server, so that is not a liveness failure.

Why uvicorn in its own thread and loop: three GET paths need no framework, its own loop keeps answering
(and reports the worker's loop as stuck) even when the worker's event loop is blocked, and its
connections are sockets, not threads, so slow clients cannot fill it.

  GET /livez   200 while the monitor ticked recently, else 503
  GET /readyz  200 while the worker runs, Temporal answers and the server sees both pollers, else 503
  GET /healthz the full state as JSON (always 200)
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import timedelta
from typing import Any

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client

from runtime.asgi_thread import ASGIThread

_QUEUE_TYPES = {"workflow": TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
                "activity": TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY}


class HealthState:
    """The latest observation; replaced whole so the HTTP thread always reads a consistent snapshot."""

    def __init__(self, stale_after_s: float):
        self.stale_after_s = stale_after_s
        self._snapshot: dict[str, Any] = {"temporal": {"reachable": False, "error": "not checked yet"},
                                          "pollers": {}, "worker_running": False, "checked_at": None}
        self._ticked = time.monotonic()

    def publish(self, snapshot: dict[str, Any]) -> None:
        self._snapshot = snapshot
        self._ticked = time.monotonic()

    def view(self) -> dict[str, Any]:
        s = dict(self._snapshot)
        age = time.monotonic() - self._ticked
        s["loop_responsive"] = age < self.stale_after_s
        s["live"] = s["loop_responsive"]
        s["ready"] = (s["live"] and s["worker_running"] and s["temporal"]["reachable"] and bool(s["pollers"])
                      and all(s["pollers"].values()))
        return s


async def observe(client: Client, task_queue: str, identity: str, worker_running: bool,
                  timeout_s: float = 5.0) -> dict[str, Any]:
    """One look at the server: is it serving, and does it see this worker polling both queues?"""
    timeout = timedelta(seconds=timeout_s)
    snapshot: dict[str, Any] = {"worker_running": worker_running, "task_queue": task_queue, "identity": identity,
                                "checked_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "pollers": {}}
    try:
        serving = await client.service_client.check_health(timeout=timeout)
        for name, kind in _QUEUE_TYPES.items():
            resp = await client.workflow_service.describe_task_queue(
                DescribeTaskQueueRequest(namespace=client.namespace, task_queue=TaskQueue(name=task_queue),
                                         task_queue_type=kind), timeout=timeout)
            snapshot["pollers"][name] = any(p.identity == identity for p in resp.pollers)
        snapshot["temporal"] = {"reachable": bool(serving), "error": None if serving else "not SERVING"}
    except Exception as e:  # any failure to reach the server is the observation itself
        snapshot["temporal"] = {"reachable": False, "error": f"{type(e).__name__}: {str(e)[:200]}"}
    return snapshot


async def monitor(state: HealthState, client: Client, task_queue: str, identity: str, worker,
                  interval_s: float) -> None:
    """Refresh ``state`` every ``interval_s`` (every second until first ready) until cancelled."""
    while True:
        state.publish(await observe(client, task_queue, identity, worker.is_running and not worker.is_shutdown))
        await asyncio.sleep(interval_s if state.view()["ready"] else min(1.0, interval_s))


class HealthServer:
    """Serves ``state`` on HOST:PORT from its own thread and event loop (uvicorn, runtime/asgi_thread.py);
    ``close()`` stops it. A slow or silent client holds a socket, not a thread: forty of them sending a
    byte a second leave /livez answering (the thread pool they used to fill answered 503 and a liveness
    probe would have restarted the worker); each must send its headers within ``header_timeout_s``."""

    def __init__(self, state: HealthState, bind: str, *, header_timeout_s: float = 10.0):
        host, _, port = bind.rpartition(":")
        self.state = state
        self._http = ASGIThread(self._app, host or "0.0.0.0", int(port), "health", header_timeout_s=header_timeout_s)

    async def _app(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        view = self.state.view()
        path = scope["path"]
        if path == "/livez":
            code = 200 if view["live"] else 503
        elif path == "/readyz":
            code = 200 if view["ready"] else 503
        elif path == "/healthz":
            code = 200
        else:
            code, view = 404, {"message": "not found: /livez /readyz /healthz"}
        body = json.dumps(view).encode()
        await send({"type": "http.response.start", "status": code,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    @property
    def port(self) -> int:
        return self._http.port

    def close(self) -> None:
        self._http.close()
