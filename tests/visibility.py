"""Absence in Temporal visibility, proven by an event instead of a sleep.

Visibility is eventually consistent, so "no workflow was started" cannot be read right after the fact
(a 1 s sleep only hoped the lag was shorter; under load it is not). Instead a barrier workflow is
started on the same task queue *after* the action under test, and the listing is read until the
barrier shows up: the dev server's visibility applies starts in order, so by then a workflow the
action wrongly started is listed too. No worker is needed (the barrier never runs); it is terminated.
"""

from __future__ import annotations

import asyncio
import time
import uuid

BARRIER_TYPE = "VisibilityBarrier"


async def workflows_started_on(client, queue: str, *, since: str | None = None, timeout: float = 60.0) -> list[str]:
    """Ids of the workflows on ``queue`` (started at or after ``since``, an ISO time), the barrier excluded."""
    barrier = f"visibility-barrier-{uuid.uuid4().hex[:10]}"
    handle = await client.start_workflow(BARRIER_TYPE, id=barrier, task_queue=queue)
    query = f"TaskQueue = '{queue}'" + (f" AND StartTime >= '{since}'" if since else "")
    deadline = time.monotonic() + timeout
    try:
        while True:
            ids = [wf.id async for wf in client.list_workflows(query)]
            if barrier in ids:
                return [i for i in ids if i != barrier]
            if time.monotonic() > deadline:
                raise AssertionError(f"the barrier workflow {barrier} is not listed on {queue} after {timeout:.0f} s")
            await asyncio.sleep(0.1)
    finally:
        await handle.terminate("visibility barrier")
