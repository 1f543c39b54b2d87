"""RegistryClient against the real local registry (plus MockTransport for redirect/realm hygiene)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess

import httpx
import pytest

from clients.registry import (
    DigestMismatch,
    NotFound,
    ProtocolError,
    RateLimited,
    RegistryClient,
    RegistryUnavailable,
    Unauthorized,
    parse_retry_after,
    parse_www_authenticate,
)
from domain.validation import OCI_INDEX
from tests.registry.imagepush import ImageSpec, Pusher


class RecordingSleep:
    def __init__(self) -> None:
        self.calls: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


async def skopeo_raw(*args: str) -> bytes:
    """``skopeo inspect --raw`` as an independent oracle for the manifest bytes."""
    def run() -> bytes:
        return subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", *args],
                              capture_output=True, check=True, timeout=60).stdout

    return await asyncio.to_thread(run)


def client_for(handle, credentials=None, **kw) -> RegistryClient:
    return RegistryClient(handle.host, scheme="http", credentials=credentials, **kw)


async def push(handle, repo, tag, specs, **kw):
    pusher = Pusher(handle.url, handle.credentials)
    try:
        as_index = kw.pop("index", False)
        if len(specs) == 1 and not as_index:
            return (await pusher.push_image(repo, tag, specs[0])).digest
        digest, _ = await pusher.push_index(repo, tag, specs, **kw)
        return digest
    finally:
        await pusher.aclose()


def test_parse_www_authenticate_quoted_commas_and_escapes():
    c = parse_www_authenticate(
        'Bearer realm="https://ghcr.io/token",service="ghcr.io",scope="repository:o/i:pull,push",'
        'error="insufficient_scope"')
    assert c.scheme == "bearer"
    assert c.params == {"realm": "https://ghcr.io/token", "service": "ghcr.io",
                        "scope": "repository:o/i:pull,push", "error": "insufficient_scope"}
    b = parse_www_authenticate(r'Basic realm="a \"lab\"", charset=UTF-8')
    assert b.scheme == "basic" and b.params == {"realm": 'a "lab"', "charset": "UTF-8"}
    assert parse_www_authenticate("") is None


def test_parse_retry_after():
    assert parse_retry_after("2") == 2.0
    assert parse_retry_after(None) is None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0
    assert parse_retry_after("soon") is None


async def test_index_digest_matches_skopeo_and_sha256_of_raw_bytes(open_registry):
    digest = await push(open_registry, "lab/oracle", "v1",
                        [ImageSpec("linux/amd64", seed="o1"), ImageSpec("linux/arm64", seed="o2")], index=True)
    async with client_for(open_registry) as client:
        head = await client.head_manifest("lab/oracle", "v1")
        raw = await client.get_manifest("lab/oracle", head.digest)
    assert head.digest == digest == raw.digest
    assert raw.media_type == OCI_INDEX
    assert "sha256:" + hashlib.sha256(raw.data).hexdigest() == raw.digest
    out = await skopeo_raw(f"docker://{open_registry.host}/lab/oracle:v1")
    assert "sha256:" + hashlib.sha256(out).hexdigest() == raw.digest
    assert out == raw.data


async def test_docker_schema2_public_repo_skopeo_no_creds(token_registry):
    token_registry.set_public("lab/docker-pub", True)
    digest = await push(token_registry, "lab/docker-pub", "v1", [ImageSpec(docker=True, seed="d")])
    async with client_for(token_registry) as client:
        raw = await client.get_manifest("lab/docker-pub", "v1")
        assert raw.digest == digest
        assert json.loads(raw.data)["mediaType"] == raw.media_type
        config = await client.get_blob("lab/docker-pub", json.loads(raw.data)["config"]["digest"])
        assert json.loads(config)["architecture"] == "amd64"
    out = await skopeo_raw("--no-creds", f"docker://{token_registry.host}/lab/docker-pub:v1")
    assert "sha256:" + hashlib.sha256(out).hexdigest() == digest


async def test_bearer_token_is_cached_per_scope(token_registry):
    await push(token_registry, "lab/cache", "v1", [ImageSpec(seed="c")])
    async with client_for(token_registry, token_registry.credentials) as client:
        await client.head_manifest("lab/cache", "v1")
        await client.get_manifest("lab/cache", "v1")
        assert client.token_requests == 1


async def test_anonymous_on_private_repo_fails_at_token_step(token_registry):
    await push(token_registry, "lab/private-c", "v1", [ImageSpec(seed="p")])
    async with client_for(token_registry) as client:
        with pytest.raises(Unauthorized) as e:
            await client.head_manifest("lab/private-c", "v1")
    assert e.value.step == "token" and e.value.status == 401


async def test_basic_registry_anonymous_and_credentialed(htpasswd_registry):
    await push(htpasswd_registry, "lab/basic", "v1", [ImageSpec(seed="b")])
    async with client_for(htpasswd_registry) as anon:
        with pytest.raises(Unauthorized) as e:
            await anon.head_manifest("lab/basic", "v1")
        assert e.value.scheme == "basic"
    async with client_for(htpasswd_registry, htpasswd_registry.credentials) as client:
        assert (await client.head_manifest("lab/basic", "v1")).digest.startswith("sha256:")
    async with client_for(htpasswd_registry, ("sandbox-pusher", "wrong-password")) as bad:
        with pytest.raises(Unauthorized) as e:
            await bad.head_manifest("lab/basic", "v1")
    assert "wrong-password" not in str(e.value)


async def test_not_found_codes(open_registry):
    await push(open_registry, "lab/nf", "v1", [ImageSpec(seed="n")])
    async with client_for(open_registry) as client:
        with pytest.raises(NotFound) as tag:
            await client.get_manifest("lab/nf", "nope")
        with pytest.raises(NotFound) as name:
            await client.head_manifest("lab/never-pushed", "v1")
    assert tag.value.code == "MANIFEST_UNKNOWN"
    assert name.value.status == 404


async def test_429_retry_after_is_honoured(token_registry):
    token_registry.set_public("lab/rl", True)
    digest = await push(token_registry, "lab/rl", "v1", [ImageSpec(seed="r")])
    sleep = RecordingSleep()
    before = token_registry.faults_served
    token_registry.inject(429, 2, retry_after=1.5)
    async with client_for(token_registry, sleep=sleep) as client:
        assert (await client.head_manifest("lab/rl", "v1")).digest == digest
    assert sleep.calls == [1.5, 1.5]
    assert token_registry.faults_served - before == 2


async def test_429_beyond_budget_raises_rate_limited(token_registry):
    sleep = RecordingSleep()
    token_registry.inject(429, 10, retry_after=2)
    try:
        async with client_for(token_registry, sleep=sleep, max_retries=2) as client:
            with pytest.raises(RateLimited) as e:
                await client.head_manifest("lab/rl", "v1")
    finally:
        token_registry.inject(429, 0)
    assert e.value.retry_after == 2 and len(sleep.calls) == 2


async def test_503_beyond_budget_raises_unavailable(token_registry):
    token_registry.inject(503, 10)
    try:
        async with client_for(token_registry, sleep=RecordingSleep(), max_retries=1) as client:
            with pytest.raises(RegistryUnavailable):
                await client.head_manifest("lab/rl", "v1")
    finally:
        token_registry.inject(503, 0)


async def test_secrets_never_in_repr_or_errors(token_registry):
    user, secret = token_registry.credentials
    client = client_for(token_registry, (user, secret))
    assert secret not in repr(client)
    async with client:
        with pytest.raises(NotFound) as e:
            await client.get_manifest("lab/never-pushed-s", "v1")
        token = next(iter(client._tokens.values())).value
    for text in (str(e.value), repr(e.value)):
        assert secret not in text and token not in text


def _mock(handler) -> httpx.MockTransport:
    return httpx.MockTransport(handler)


async def test_blob_redirect_never_forwards_authorization_cross_host():
    body = b'{"architecture":"amd64"}'
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    seen: list[tuple[str, str | None]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.host, request.headers.get("authorization")))
        if request.url.host == "registry.test":
            return httpx.Response(307, headers={"Location": "https://cdn.test/signed?sig=abc"})
        return httpx.Response(200, content=body)

    async with RegistryClient("registry.test", credentials=("u", "s3cret"), transport=_mock(handler)) as c:
        c._basic = True  # as if the registry had asked for Basic auth
        assert await c.get_blob("o/i", digest) == body
    assert seen[0][0] == "registry.test" and seen[0][1] is not None
    assert seen[1] == ("cdn.test", None)


async def test_announced_digest_mismatch_is_rejected():
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=b'{"schemaVersion":2}', headers={
            "Content-Type": "application/vnd.oci.image.manifest.v1+json",
            "Docker-Content-Digest": "sha256:" + "0" * 64})

    async with RegistryClient("registry.test", transport=_mock(handler)) as c:
        with pytest.raises(DigestMismatch):
            await c.get_manifest("o/i", "v1")


async def test_plain_http_realm_refused_for_https_registry():
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(401, headers={
            "WWW-Authenticate": 'Bearer realm="http://evil.test/token",service="x"'})

    async with RegistryClient("registry.test", transport=_mock(handler)) as c:
        with pytest.raises(ProtocolError):
            await c.head_manifest("o/i", "v1")
