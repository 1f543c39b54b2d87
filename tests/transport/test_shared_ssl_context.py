"""Every HTTP client of the service verifies TLS with one context built once per process
(clients/http_guard.py ``shared_ssl_context``): httpx built a new one per client, loading the CA bundle on
the event loop each time an activity opened an Iris client (39% of the bench worker's CPU at 200 targets).

Checked: clients share the context, the context still verifies (a self-signed server is refused by name,
over a real handshake), and a caller's own ``verify`` is kept."""

from __future__ import annotations

import ssl
import subprocess
import threading

import httpx
import pytest

from clients import http_guard
from clients.iris import IrisClient


def _context_of(client: httpx.AsyncClient | httpx.Client) -> ssl.SSLContext:
    return client._transport._pool._ssl_context  # httpx's default transport keeps it here


async def test_clients_share_one_verifying_context():
    a = IrisClient("http://127.0.0.1:1", client_revision_date="2026-11-20")
    b = IrisClient("https://iris.example:443", client_revision_date="2026-11-20", token="t")
    sync = http_guard.sync_client(allowed_hosts=["x.example"], credential="k", max_body_bytes=10)
    try:
        ctx = _context_of(a._http)
        assert ctx is _context_of(b._http) and ctx is _context_of(sync)  # one per client before
        assert ctx is http_guard.shared_ssl_context()
        assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
        assert ctx.cert_store_stats()["x509_ca"] > 0  # the CA bundle was loaded (certifi, or SSL_CERT_*)
    finally:
        await a.aclose()
        await b.aclose()
        sync.close()


def test_a_callers_own_verify_is_kept():
    own = ssl.create_default_context()
    with http_guard.sync_client(allowed_hosts=[], credential="k", max_body_bytes=10, verify=own) as c:
        assert _context_of(c) is own


@pytest.fixture
def self_signed_server(tmp_path):
    """A TLS server on loopback whose certificate no CA signed."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    import socket

    sock = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve():
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            try:
                with ctx.wrap_socket(conn, server_side=True) as tls:
                    tls.recv(1024)
                    tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
            except (ssl.SSLError, OSError):
                pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield sock.getsockname()[1]
    stop.set()
    t.join(5)
    sock.close()


async def test_the_shared_context_still_refuses_an_unsigned_certificate(self_signed_server):
    iris = IrisClient(f"https://127.0.0.1:{self_signed_server}", client_revision_date="2026-11-20", max_attempts=1)
    try:
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            await iris._http.get("/health")
    finally:
        await iris.aclose()
    # The same server with verification off answers: the refusal above is the verification, not the server.
    async with httpx.AsyncClient(verify=False) as c:
        assert (await c.get(f"https://127.0.0.1:{self_signed_server}/")).text == "ok"
