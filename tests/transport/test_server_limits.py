"""The worker's own HTTP servers (health probes, GitHub webhook receiver) cannot be starved by slow
clients (issue #27 item 2, issue #36 item 3).

Both run on uvicorn in their own thread and event loop (runtime/asgi_thread.py): a connection is a socket,
not a thread. Forty clients sending one byte a second leave /livez answering 200 and a signed webhook
accepted (the hand-written ThreadingHTTPServer answered everyone past its 32 connection threads 503, so a
liveness probe would have restarted the worker); fifty idle connections add no thread and are closed at
the header deadline; a request trickling its headers is cut at it; a body that never arrives is answered
408 and closed.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx
import pytest

from domain.config import GitHubWebhookSettings
from domain.github_webhook import sign
from runtime.health import HealthServer, HealthState
from runtime.webhooks import WebhookReceiver

IDLE = 50
SLOW = 40


def _wait(predicate, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"no {what} within {timeout:g} s"
        time.sleep(0.05)


def _closed_by_server(sock: socket.socket, timeout: float = 60.0) -> bytes:
    """Everything the server sent until it closed the connection (bounded)."""
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(4096):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _receiver(loop, **limits) -> WebhookReceiver:
    settings = GitHubWebhookSettings(listen=f"127.0.0.1:{_free_port()}", secret={"kind": "env", "name": "UNUSED"},
                                     **limits)

    async def wake(ev, delivery):
        return ["wf-1"]

    return WebhookReceiver(settings, "secret", "acme/x", wake, loop)


@pytest.fixture(params=["health", "webhook"])
def server(request):
    """(server, what it serves): the health probes and the webhook receiver with a 1 s header deadline."""
    if request.param == "health":
        srv = HealthServer(HealthState(stale_after_s=60), "127.0.0.1:0", header_timeout_s=1.0)
        yield srv, "health"
        srv.close()
        return
    loop = asyncio.new_event_loop()
    srv = _receiver(loop, max_connections=8, idle_timeout_s=1.0, read_timeout_s=1.0)
    yield srv, "webhook"
    srv.close()
    loop.close()


def test_fifty_idle_connections_add_no_thread_and_are_closed(server):
    srv, _ = server
    before = threading.active_count()
    clients = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(IDLE)]
    try:
        time.sleep(0.3)
        assert threading.active_count() <= before + 1  # not one thread per connection
        answers = [_closed_by_server(c, timeout=30) for c in clients]  # every one closed by the server
    finally:
        for c in clients:
            c.close()
    assert answers == [b""] * IDLE


def test_a_request_trickling_its_headers_is_cut_at_the_read_deadline(server):
    srv, what = server
    sock = socket.create_connection(("127.0.0.1", srv.port))
    path = b"/livez" if what == "health" else b"/github/webhook"
    sock.sendall(b"GET " + path + b" HTTP/1.1\r\n")
    started = time.monotonic()
    try:
        for _ in range(100):  # one header byte every 0.1 s: only the header deadline can end it
            try:
                sock.sendall(b"X")
            except OSError:
                break
            time.sleep(0.1)
        assert _closed_by_server(sock, timeout=30) == b""
    finally:
        sock.close()
    assert time.monotonic() - started < 8, "cut at the 1 s header deadline, not at the end of the trickle"


def test_a_body_that_never_arrives_is_answered_408_and_closed(server):
    srv, what = server
    if what == "health":
        pytest.skip("the health server reads no bodies")
    sock = socket.create_connection(("127.0.0.1", srv.port))
    try:
        sock.sendall(b"POST /github/webhook HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        answer = _closed_by_server(sock, timeout=30)
    finally:
        sock.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]


async def test_forty_slow_clients_leave_livez_at_200_and_a_signed_webhook_accepted():
    """Forty clients on each port, each sending one byte of its headers a second, for six seconds."""
    state = HealthState(stale_after_s=60)
    state.publish({"temporal": {"reachable": True, "error": None}, "pollers": {"workflow": True},
                   "worker_running": True, "checked_at": None})
    health = HealthServer(state, "127.0.0.1:0")
    hook = _receiver(asyncio.get_running_loop())
    stop = threading.Event()

    def trickle(port: int) -> None:
        sock = socket.create_connection(("127.0.0.1", port))
        try:
            for b in b"POST /github/webhook HTTP/1.1\r\nHost: slow\r\n":
                if stop.wait(1.0):
                    return
                sock.sendall(bytes([b]))
        except OSError:
            pass
        finally:
            sock.close()

    slow = [threading.Thread(target=trickle, args=(port,), daemon=True)
            for port in (health.port, hook.port) for _ in range(SLOW)]
    for t in slow:
        t.start()
    try:
        await asyncio.sleep(1.5)  # every slow client connected and trickling
        body = json.dumps({"action": "completed", "repository": {"full_name": "acme/x"},
                           "check_run": {"head_sha": "a" * 40, "pull_requests": [
                               {"number": 3, "head": {"ref": "b", "sha": "a" * 40}}]}}).encode()
        codes, webhooks = [], []
        async with httpx.AsyncClient(timeout=5) as http:
            for i in range(10):
                codes.append((await http.get(f"http://127.0.0.1:{health.port}/livez")).status_code)
                resp = await http.post(f"http://127.0.0.1:{hook.port}/github/webhook", content=body, headers={
                    "X-GitHub-Event": "check_run", "X-GitHub-Delivery": f"slow-{i}",
                    "X-Hub-Signature-256": sign(b"secret", body), "Content-Type": "application/json"})
                webhooks.append(resp.status_code)
                await asyncio.sleep(0.4)
        assert codes == [200] * 10, codes
        assert webhooks == [202] * 10, webhooks
        assert sum(t.is_alive() for t in slow) >= SLOW  # the slow clients were still there throughout
    finally:
        stop.set()
        for t in slow:
            t.join(timeout=5)
        health.close()
        hook.close()
