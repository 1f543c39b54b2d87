"""A stand-in for the controller's job list (tests and bench only): answers the status RPCs the watcher
sends (GetJobState, GetJobStatus, ListJobs, FetchLogs) from an in-memory table, so thousands of watched
jobs need no real Iris jobs. Requests are counted by RPC method like on the wire."""

from __future__ import annotations

import json
import time
from collections import Counter

import httpx

AUDIT_KEY = "/system/controller"


class StandinJobs(httpx.AsyncBaseTransport):
    """``jobs``: job id -> short state (``running``, ``succeeded``, ...); ``lines``: log entries.

    ``audit_lag_s`` (None: off): the controller's audit feed as marin-iris 0.2.227 writes it (domain/controller_feed.py):
    a ``job_submitted`` line per initial job and a ``job_terminated`` line per end under ``/system/controller``, each
    readable ``audit_lag_s`` after it happened (1.5-1.7 s measured on the real local controller: its log client
    flushes once a second)."""

    def __init__(self, jobs: dict[str, str] | None = None, *, audit_lag_s: float | None = None) -> None:
        self.jobs: dict[str, str] = dict(jobs or {})
        self.audit_lag_s = audit_lag_s
        self.finished_ms: dict[str, int] = {}
        self.requests: Counter[str] = Counter()
        # (method, the calling activity's "run-id-prefix/attempt" or "", loop time): who asked what, when
        self.calls: list[tuple[str, str, float]] = []
        self.lines: list[dict] = []  # {"key", "data", "seq"}
        self.stall_s = 0.0  # answer every request this late (a stalled controller)
        self.stall_once: dict[str, float] = {}  # method -> hang its next request this long (then answer)
        self.block_once: dict[str, float] = {}  # method -> block the whole event loop this long (a starved worker)
        for j in self.jobs:
            self._audit("job_submitted", j, "-", "num_tasks=1")

    def set_state(self, job_id: str, state: str) -> None:
        self.jobs[job_id] = state
        if state not in ("pending", "running"):
            self.finished_ms[job_id] = int(time.time() * 1000)
            self._audit("job_terminated", job_id, "task_updates_applied",
                        "reason=Job completed successfully" if state == "succeeded" else "reason=Exit code: 1")

    def _audit(self, action: str, entity: str, trigger: str, extra: str) -> None:
        if self.audit_lag_s is None:
            return
        now = time.time()
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + f",{int(now * 1000) % 1000:03d}"
        self.lines.append({"key": AUDIT_KEY, "source": "process", "level": "LOG_LEVEL_INFO",
                           "data": f"{stamp} iris.cluster.controller.audit_logging event={action} entity={entity} "
                                   f"trigger={trigger} {extra}",
                           "seq": len(self.lines) + 1, "visible_at": now + self.audit_lag_s})

    def log(self, job_id: str, text: str) -> None:
        self.lines.append({"key": f"{job_id}/0:0", "data": text, "seq": len(self.lines) + 1})

    def _status(self, job_id: str) -> dict:
        state = self.jobs[job_id]
        now = int(time.time() * 1000)
        status = {"jobId": job_id, "state": f"JOB_STATE_{state.upper()}", "submittedAt": {"epochMs": str(now - 60_000)},
                  "startedAt": {"epochMs": str(now - 50_000)}}
        if job_id in self.finished_ms:
            status["finishedAt"] = {"epochMs": str(self.finished_ms[job_id])}
        return status

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        import asyncio

        from temporalio import activity

        method = request.url.path.rsplit("/", 1)[-1]
        if method == "FetchLogs" and b'"/system/controller"' in request.content:
            method = "FetchLogs(feed)"  # the watcher's audit feed: log requests, counted apart
        self.requests[method] += 1
        caller = ""
        if activity.in_activity():
            caller = f"{activity.info().workflow_run_id[:8]}/{activity.info().attempt}"
        self.calls.append((method, caller, asyncio.get_running_loop().time()))
        if self.stall_s:
            await asyncio.sleep(self.stall_s)
        if method in self.stall_once:
            await asyncio.sleep(self.stall_once.pop(method))
        if method in self.block_once:
            time.sleep(self.block_once.pop(method))
        body = json.loads(await request.aread() or b"{}")
        if method == "GetJobState":
            reply = {"states": {j: f"JOB_STATE_{self.jobs[j].upper()}" for j in body.get("jobIds", []) if j in self.jobs}}
        elif method == "GetJobStatus":
            j = body.get("jobId")
            if j not in self.jobs:
                return httpx.Response(404, json={"code": "not_found", "message": f"job {j} not found"})
            reply = {"job": self._status(j)}
        elif method == "ListJobs":
            q = body.get("query") or {}
            prefix, state = q.get("jobIdPrefix") or "", q.get("stateFilter") or ""
            offset, limit = int(q.get("offset") or 0), int(q.get("limit") or 50)
            rows = [j for j, s in self.jobs.items() if j.startswith(prefix) and (not state or s == state)]
            reply = {"jobs": [self._status(j) for j in rows[offset:offset + limit]],
                     "hasMore": offset + limit < len(rows), "totalCount": len(rows)}
        elif method in ("FetchLogs", "FetchLogs(feed)"):
            source, cursor = body.get("source", ""), int(body.get("cursor") or 0)
            limit = int(body.get("maxLines") or 1000)
            now = time.time()
            after = self.lines[cursor:]  # seq is the index + 1: the lines after the cursor, without a scan
            rows = [e for e in after if e["key"].startswith(source) and e.get("visible_at", 0) <= now][:limit]
            if any("visible_at" in e for e in rows):  # the controller's lines: the same seq order, shown later
                hidden = min((x["seq"] for x in after if x.get("visible_at", 0) > now), default=float("inf"))
                rows = [e for e in rows if e["seq"] < hidden]
            reply = {"entries": [{k: v for k, v in e.items() if k != "visible_at"} for e in rows],
                     "cursor": str(rows[-1]["seq"] if rows else cursor)}
        else:
            return httpx.Response(404, json={"code": "unimplemented", "message": method})
        return httpx.Response(200, json=reply)
