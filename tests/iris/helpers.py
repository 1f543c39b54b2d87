"""Polling helpers for tests against the real local controller (no timed assertions), and two real ways to
reach a controller whose endpoint proxy has no log server (``private_listener``, ``proxy_without_log_server``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict

import httpx

from clients.iris import LOG_SERVER_PROXY_PREFIX, LOG_SERVICE, IrisClient, JobInfo, LaunchSpec, Resources
from sandbox.ports import listening_ports

LOG_PROXY_PATH = f"{LOG_SERVER_PROXY_PREFIX}/{LOG_SERVICE}/FetchLogs"

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


def private_listener(handle) -> int:
    """The port of a controller's private (Python) listener: it serves ``/health`` and every RPC like the
    public one, but has no endpoint proxy (404 on the log server path). What the CI flake's tests talked to."""
    for port in sorted(listening_ports(handle.pid) - {handle.port}):
        base = f"http://127.0.0.1:{port}"
        try:
            health = httpx.get(f"{base}/health", timeout=5.0)
            if health.status_code == 200 and health.json().get("status") == "ok":
                if httpx.post(f"{base}{LOG_PROXY_PATH}", json={}, timeout=5.0).status_code == 404:
                    return port
        except (httpx.HTTPError, ValueError):
            continue
    raise AssertionError(f"no private listener among {listening_ports(handle.pid)} of pid {handle.pid}")


@contextlib.contextmanager
def proxy_without_log_server(controller_url: str) -> Iterator[str]:
    """A real marin-iris public listener (``iris_native.NativeProxy``, what a controller serves on its port)
    in front of ``controller_url`` whose endpoint registry holds no ``/system/log-server``: RPCs reach the
    controller, a log read gets the listener's own 404 ``{"error": "No endpoint 'system.log-server'"}``,
    as from a production controller while its log server endpoint is not registered. Yields its URL."""
    from iris.cluster.controller.auth import NativeProxyAuthConfig, NativeProxyAuthMode
    from iris.cluster.controller.native_proxy import NativeProxy

    auth = NativeProxyAuthConfig(mode=NativeProxyAuthMode.PERMISSIVE, issuers=(), jwks={"keys": []},
                                 leeway_seconds=30, cache_capacity=16, cache_ttl_seconds=60, trusted_cidrs=())
    proxy = NativeProxy("127.0.0.1", 0, controller_url, os.urandom(16).hex(), json.dumps(asdict(auth)))
    try:
        proxy.replace_registry(json.dumps({"generation": 1, "endpoints": []}))
        yield f"http://127.0.0.1:{proxy.port}"
    finally:
        proxy.stop()
