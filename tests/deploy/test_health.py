"""The worker health endpoint: live while the loop turns, ready only when the server sees the pollers."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

from temporalio.client import Client

from runtime.health import HealthServer, HealthState, observe


def _get(port: int, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, (json.loads(e.read() or b"{}") if e.code != 404 else {})


async def test_unreachable_server_is_live_but_not_ready():
    client = await Client.connect("127.0.0.1:1", lazy=True)
    snapshot = await observe(client, "q", "me", worker_running=True, timeout_s=1)
    assert snapshot["temporal"]["reachable"] is False and snapshot["temporal"]["error"]
    state = HealthState(stale_after_s=60)
    state.publish(snapshot)
    server = HealthServer(state, "127.0.0.1:0")
    try:
        assert (await asyncio.to_thread(_get, server.port, "/livez"))[0] == 200
        code, body = await asyncio.to_thread(_get, server.port, "/readyz")
        assert code == 503 and body["ready"] is False and body["live"] is True
        assert (await asyncio.to_thread(_get, server.port, "/nope"))[0] == 404
    finally:
        server.close()


async def test_reachable_server_without_this_pollers_is_not_ready(temporal_client):
    snapshot = await observe(temporal_client, "health-no-worker", "nobody@nowhere", worker_running=True)
    assert snapshot["temporal"]["reachable"] is True
    assert snapshot["pollers"] == {"workflow": False, "activity": False}
    state = HealthState(stale_after_s=60)
    state.publish(snapshot)
    assert state.view()["ready"] is False


def test_a_stuck_loop_fails_liveness():
    state = HealthState(stale_after_s=0.0)  # the last tick is already too old
    state.publish({"temporal": {"reachable": True}, "pollers": {"workflow": True, "activity": True},
                   "worker_running": True})
    view = state.view()
    assert view["live"] is False and view["ready"] is False
    fresh = HealthState(stale_after_s=60)
    fresh.publish({"temporal": {"reachable": True}, "pollers": {"workflow": True, "activity": True},
                   "worker_running": True})
    assert fresh.view()["ready"] is True
