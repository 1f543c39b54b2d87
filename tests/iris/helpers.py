"""Polling helpers for tests against the real local controller (no timed assertions)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from clients.iris import IrisClient, JobInfo, LaunchSpec, Resources

SMALL = Resources(cpu_millicores=100, memory_bytes=64 * 1024**2, disk_bytes=64 * 1024**2)


def bash_spec(name: str, script: str, **kw) -> LaunchSpec:
    return LaunchSpec(name=name, argv=["bash", "-c", script], resources=kw.pop("resources", SMALL), **kw)


async def wait_for(client: IrisClient, job_id: str, pred: Callable[[JobInfo], bool],
                   timeout_s: float = 90.0) -> JobInfo:
    deadline = time.monotonic() + timeout_s
    while True:
        info = await client.job_status(job_id)
        if pred(info):
            return info
        if time.monotonic() > deadline:
            raise AssertionError(f"{job_id} still {info.state} after {timeout_s}s: {info.error}")
        await asyncio.sleep(0.3)


async def wait_terminal(client: IrisClient, job_id: str, timeout_s: float = 90.0) -> JobInfo:
    return await wait_for(client, job_id, lambda i: i.is_terminal, timeout_s)
