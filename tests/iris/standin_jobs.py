"""A stand-in for the controller's job list (tests and bench only): answers the status RPCs the watcher
sends (GetJobState, GetJobStatus, ListJobs, FetchLogs) from an in-memory table, so thousands of watched
jobs need no real Iris jobs. Requests are counted by RPC method like on the wire."""

from __future__ import annotations

import json
import time
from collections import Counter

import httpx


class StandinJobs(httpx.AsyncBaseTransport):
    """``jobs``: job id -> short state (``running``, ``succeeded``, ...); ``lines``: log entries."""

    def __init__(self, jobs: dict[str, str] | None = None) -> None:
        self.jobs: dict[str, str] = dict(jobs or {})
        self.finished_ms: dict[str, int] = {}
        self.requests: Counter[str] = Counter()
        # (method, the calling activity's "run-id-prefix/attempt" or "", loop time): who asked what, when
        self.calls: list[tuple[str, str, float]] = []
        self.lines: list[dict] = []  # {"key", "data", "seq"}
        self.stall_s = 0.0  # answer every request this late (a stalled controller)
        self.stall_once: dict[str, float] = {}  # method -> hang its next request this long (then answer)
        self.block_once: dict[str, float] = {}  # method -> block the whole event loop this long (a starved worker)

    def set_state(self, job_id: str, state: str) -> None:
        self.jobs[job_id] = state
        if state not in ("pending", "running"):
            self.finished_ms[job_id] = int(time.time() * 1000)

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
        elif method == "FetchLogs":
            source, cursor = body.get("source", ""), int(body.get("cursor") or 0)
            limit = int(body.get("maxLines") or 1000)
            rows = [e for e in self.lines if e["key"].startswith(source) and e["seq"] > cursor][:limit]
            reply = {"entries": rows, "cursor": str(rows[-1]["seq"] if rows else cursor)}
        else:
            return httpx.Response(404, json={"code": "unimplemented", "message": method})
        return httpx.Response(200, json=reply)
