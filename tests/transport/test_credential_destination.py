"""At request time, in one place (clients/http_guard.py), a credential goes only to the host configured for
it and never over plain http to a host that is not loopback: a request to another host is refused before a
byte is sent, and a redirect to another host never carries the Authorization header (issue #27 item 2).

"Another host" is ``localhost`` against ``127.0.0.1``: two names, so two hosts (names are never resolved).
A remote plain-http address is a real listener on this machine's non-loopback interface."""

from __future__ import annotations

import base64
import hashlib

import httpx
import pytest

from clients import http_guard
from clients.http_guard import CredentialRefused
from clients.iris import IrisClient
from clients.registry import ProtocolError, RegistryClient
from tests.deploy.test_api_key_transport import Recorder, _non_loopback_ip
from tests.transport.standins import Server, ok_json

SENTINEL = "sentinel-credential-dest-3c9d"
BLOB = b'{"architecture": "amd64"}'
DIGEST = "sha256:" + hashlib.sha256(BLOB).hexdigest()


@pytest.fixture
def foreign():
    """A host the credential is not configured for (records what reaches it)."""
    server = Server(ok_json({"status": "ok"}), host="127.0.0.1")
    yield server
    server.close()


async def test_the_iris_token_is_not_sent_to_another_host(foreign):
    own = Server(ok_json({"status": "ok"}))
    try:
        async with IrisClient(f"http://127.0.0.1:{own.port}", token=SENTINEL, cluster_name="cw",
                              client_revision_date="2026-11-20") as iris:
            assert await iris.health()  # its own controller gets it
            with pytest.raises(CredentialRefused) as err:  # the client-wide header, aimed elsewhere
                await iris._http.get(f"http://localhost:{foreign.port}/health")
    finally:
        own.close()
    assert own.seen == [("GET", "/health", f"Bearer {SENTINEL}")]
    assert foreign.seen == []  # refused before a connection
    assert "clusters.cw.token goes only to 127.0.0.1, not to 'localhost'" in str(err.value)
    assert SENTINEL not in str(err.value)


async def test_a_credential_in_cleartext_to_a_remote_host_is_refused_before_connecting():
    ip = _non_loopback_ip()
    if ip is None:
        pytest.skip("this machine has no non-loopback IPv4 address to listen on")
    remote = Recorder(ip)
    try:
        async with http_guard.async_client(allowed_hosts=[ip], credential="github.token",
                                           max_body_bytes=1024) as http:
            with pytest.raises(CredentialRefused, match=f"github.token would go in cleartext .* to {ip}"):
                await http.get(f"http://{remote.address}/user", headers={"Authorization": f"Bearer {SENTINEL}"})
    finally:
        remote.close()
    assert (remote.connections, remote.bytes) == (0, 0)


def _redirecting(to_port: int):
    """A registry on 127.0.0.1: Basic challenge, then the blob is a redirect to another host (as ghcr sends
    blobs to its CDN)."""
    def respond(handler, server):
        if not handler.headers.get("Authorization"):
            handler.send_response(401)
            handler.send_header("WWW-Authenticate", 'Basic realm="lab"')
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        handler.send_response(307)
        handler.send_header("Location", f"http://localhost:{to_port}/blob-storage/{DIGEST}")
        handler.send_header("Content-Length", "0")
        handler.end_headers()
    return respond


def _blob(handler, server):
    handler.send_response(200)
    handler.send_header("Content-Length", str(len(BLOB)))
    handler.end_headers()
    handler.wfile.write(BLOB)


async def test_a_registry_redirect_to_another_host_carries_no_credential():
    cdn = Server(_blob, host="127.0.0.1")
    registry = Server(_redirecting(cdn.port))
    try:
        async with RegistryClient(f"127.0.0.1:{registry.port}", scheme="http", credentials=("u", SENTINEL),
                                  max_retries=0) as client:
            assert await client.get_blob("acme/x", DIGEST) == BLOB
    finally:
        registry.close()
        cdn.close()
    basic = "Basic " + base64.b64encode(f"u:{SENTINEL}".encode()).decode()
    assert [a for _, _, a in registry.seen] == [None, basic]  # the registry got the credential ...
    assert cdn.seen == [("GET", f"/blob-storage/{DIGEST}", None)]  # ... the other host did not


async def test_following_a_cross_host_redirect_with_the_header_is_refused():
    cdn = Server(_blob, host="127.0.0.1")
    registry = Server(_redirecting(cdn.port))
    headers = {"Authorization": f"Bearer {SENTINEL}"}
    try:
        async with http_guard.async_client(allowed_hosts=["127.0.0.1"], credential="registry.token",
                                           max_body_bytes=1024) as http:
            first = await http.get(f"http://127.0.0.1:{registry.port}/v2/acme/x/blobs/{DIGEST}", headers=headers)
            assert first.status_code == 307
            # what a careless redirect loop would do: the same headers to the Location
            with pytest.raises(CredentialRefused, match="registry.token goes only to 127.0.0.1, not to 'localhost'"):
                await http.get(first.headers["location"], headers=headers)
            # httpx following the redirect itself drops the header for another origin
            followed = await http.get(f"http://127.0.0.1:{registry.port}/v2/acme/x/blobs/{DIGEST}",
                                      headers=headers, follow_redirects=True)
            assert followed.content == BLOB
    finally:
        registry.close()
        cdn.close()
    assert cdn.seen == [("GET", f"/blob-storage/{DIGEST}", None)]  # only the header-less follow arrived


async def test_a_registry_token_realm_elsewhere_gets_no_credential_unless_configured():
    """The realm named by the registry's challenge gets registry.token only on the registry's own host (any
    port) or a host listed in registry.token_realm_hosts; a realm on a private host elsewhere is refused."""
    realm_seen: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/token":
            realm_seen.append(request.headers.get("authorization"))
            return httpx.Response(200, json={"token": "t"})
        if request.headers.get("authorization") != "Bearer t":
            return httpx.Response(401, headers={
                "WWW-Authenticate": 'Bearer realm="https://auth.example.org/token",service="r"'})
        return httpx.Response(404, json={"errors": [{"code": "MANIFEST_UNKNOWN"}]})

    for trusted, expected in (((), None), (("auth.example.org",), "Basic")):
        realm_seen.clear()
        async with RegistryClient("registry.example.org", credentials=("u", SENTINEL), max_retries=0,
                                  trusted_realm_hosts=trusted, transport=httpx.MockTransport(handler)) as client:
            with pytest.raises(Exception):  # noqa: B017 - the 404 after the token; only the realm matters here
                await client.head_manifest("acme/x", "latest")
        assert [(a or "").split(" ")[0] or None for a in realm_seen] == [expected]

    async with RegistryClient("127.0.0.1:5000", scheme="http", credentials=("u", SENTINEL), max_retries=0,
                              transport=httpx.MockTransport(lambda r: httpx.Response(401, headers={
                                  "WWW-Authenticate": 'Bearer realm="http://localhost:5001/token"'}))) as client:
        with pytest.raises(ProtocolError, match="refusing private token realm host 'localhost'"):
            await client.head_manifest("acme/x", "latest")
