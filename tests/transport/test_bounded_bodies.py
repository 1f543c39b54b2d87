"""Every remote body is read up to a cap (clients/http_guard.py): a reply that never ends stops at the cap
with an error naming the URL and the cap, for Iris's ``/health`` (issue #27 item 2: 148 MiB read in
120 s before), an Iris RPC, a registry manifest and GitHub's ``GET /user``; the evidence store reads no
more than the recorded size.

Each call is bounded by ``asyncio.wait_for``: without the cap it would read until that bound."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from clients import iris as iris_mod
from clients import registry as registry_mod
from clients.evidence import EvidenceError, EvidenceStore, read_evidence
from clients.identity import IdentityError, token_identity
from clients.iris import Internal, IrisClient
from clients.registry import ProtocolError, RegistryClient
from domain.models import FileRef
from tests.transport.standins import Server, endless, long

BOUND_S = 120.0


@pytest.fixture
def endless_server():
    server = Server(endless)
    yield server
    server.close()


async def test_iris_health_stops_at_its_cap(endless_server):
    url = f"http://127.0.0.1:{endless_server.port}"
    async with IrisClient(url, client_revision_date="2026-11-20") as iris:
        with pytest.raises(Internal) as err:
            await asyncio.wait_for(iris.health(), BOUND_S)
    assert f"{url}/health" in str(err.value) and f"larger than {iris_mod.MAX_HEALTH_BYTES} bytes" in str(err.value)


async def test_an_iris_rpc_reply_stops_at_its_cap(endless_server):
    url = f"http://127.0.0.1:{endless_server.port}"
    async with IrisClient(url, client_revision_date="2026-11-20", max_attempts=1) as iris:
        with pytest.raises(Internal) as err:
            await asyncio.wait_for(iris.list_workers(), BOUND_S)
    assert not err.value.transient  # read again it would be as long: stopped at once, not retried
    assert "/iris.cluster.ControllerService/ListWorkers" in str(err.value)
    assert f"larger than {iris_mod.MAX_REPLY_BYTES} bytes" in str(err.value)


async def test_a_registry_manifest_stops_at_its_cap(endless_server):
    host = f"127.0.0.1:{endless_server.port}"
    async with RegistryClient(host, scheme="http", max_retries=0) as client:
        with pytest.raises(ProtocolError) as err:
            await asyncio.wait_for(client.get_manifest("acme/x", "latest"), BOUND_S)
    assert f"http://{host}/v2/acme/x/manifests/latest" in str(err.value)
    assert f"larger than {registry_mod.MAX_MANIFEST_BYTES} bytes" in str(err.value)


def test_githubs_user_lookup_stops_at_its_cap():
    server = Server(long(32 * 1024 * 1024))  # 128 times the cap; a thread cannot be cancelled, so it ends
    url = f"http://127.0.0.1:{server.port}"
    try:
        with pytest.raises(IdentityError) as err:
            token_identity(url, "sentinel-tok-4471", what="github.token")
    finally:
        server.close()
    assert f"{url}/user" in str(err.value) and "larger than 262144 bytes" in str(err.value)
    assert "sentinel-tok-4471" not in str(err.value)


def test_an_evidence_file_larger_than_recorded_is_not_read_whole(tmp_path):
    store = EvidenceStore(str(tmp_path / "evidence"))
    ref = store.put_text("req-1", "log.txt", "line\n" * 10)
    assert read_evidence(ref) == b"line\n" * 10
    path = tmp_path / "evidence" / "req-1" / "log.txt"
    path.write_bytes(b"y" * (8 * 1024 * 1024))  # the store now holds far more than history recorded
    with pytest.raises(EvidenceError, match=f"larger than the recorded {ref.size_bytes} bytes"):
        read_evidence(ref)
    small = FileRef(uri=ref.uri, sha256=hashlib.sha256(b"y" * 10).hexdigest(), size_bytes=10)
    with pytest.raises(EvidenceError, match="larger than the recorded 10 bytes"):
        read_evidence(small)
