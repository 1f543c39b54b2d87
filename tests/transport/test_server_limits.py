"""The worker's own HTTP servers (health probes, GitHub webhook receiver) bound their connections: at most
``max_connections`` threads (one more is answered 503 and closed), an idle connection is closed after
``idle_timeout_s``, and a request whose headers or body trickle in is cut at ``read_timeout_s`` (issue #27
item 2: before, 50 idle connections took the process from 19 to 69 threads, for good).

Thread counts are read by name: every connection thread is named after its server."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

from domain.config import GitHubWebhookSettings
from runtime.health import HealthServer, HealthState
from runtime.webhooks import WebhookReceiver

IDLE = 50


def _threads(prefix: str) -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith(prefix) and t.name.endswith("-connection"))


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


@pytest.fixture(params=["health", "webhook"])
def server(request):
    """(server, thread-name prefix, max connections): the health probes with their defaults (32, 10 s), the
    webhook receiver with a configured limit (8, 1 s)."""
    if request.param == "health":
        srv = HealthServer(HealthState(stale_after_s=60), "127.0.0.1:0")
        yield srv, "health", 32
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        settings = GitHubWebhookSettings(listen=f"127.0.0.1:{port}", secret={"kind": "env", "name": "UNUSED"},
                                         max_connections=8, idle_timeout_s=1.0, read_timeout_s=1.0)

        async def wake(ev, delivery):
            return []

        loop = asyncio.new_event_loop()
        srv = WebhookReceiver(settings, "secret", "acme/x", wake, loop)
        yield srv, "github-webhooks", 8
        loop.close()
    srv.close()


def test_fifty_idle_connections_keep_the_thread_count_bounded_and_are_closed(server):
    srv, prefix, cap = server
    http = srv._http._server
    assert _threads(prefix) == 0
    clients = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(IDLE)]
    try:
        _wait(lambda: http.accepted == IDLE, "accept of every connection")
        assert _threads(prefix) <= cap and http.peak <= cap  # not one thread per connection
        answers = [_closed_by_server(c) for c in clients]  # every one is closed by the server
    finally:
        for c in clients:
            c.close()
    assert http.peak == cap or http.refused == 0  # the cap was reached, or idle ones ended first
    busy = [a for a in answers if a.startswith(b"HTTP/1.1 503")]
    assert len(busy) == http.refused and answers.count(b"") == IDLE - http.refused  # idle ones: no word
    _wait(lambda: _threads(prefix) == 0, "connection threads to end")


def test_a_request_trickling_its_headers_is_cut_at_the_read_deadline(server):
    srv, prefix, _ = server
    if prefix == "health":
        pytest.skip("the health server keeps its 30 s default; the webhook receiver is configured to 1 s")
    sock = socket.create_connection(("127.0.0.1", srv.port))
    sock.sendall(b"POST /github/webhook HTTP/1.1\r\n")
    try:
        # One header byte at a time, each well inside the 1 s idle timeout: only the read deadline can end it.
        for _ in range(400):
            try:
                sock.sendall(b"X")
            except OSError:
                break
            if srv._http._server.cut:
                break
            time.sleep(0.1)
        _wait(lambda: srv._http._server.cut == 1, "cut at the read deadline", timeout=30)
        assert _closed_by_server(sock) == b""
    finally:
        sock.close()
    _wait(lambda: _threads(prefix) == 0, "connection thread to end")


def test_a_body_that_never_arrives_is_cut_and_refused(server):
    srv, prefix, _ = server
    if prefix == "health":
        pytest.skip("the health server reads no bodies")
    sock = socket.create_connection(("127.0.0.1", srv.port))
    try:
        sock.sendall(b"POST /github/webhook HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        assert _closed_by_server(sock) == b""  # neither 401 nor a handler: cut while reading the body
    finally:
        sock.close()
    _wait(lambda: _threads(prefix) == 0, "connection thread to end")
