"""The worker's shared registry connection pool: one httpx client per origin, fewest requests, no state
carried from authenticated reads into the anonymous probe."""

from __future__ import annotations

import httpx

from clients.image_validator import validate_image
from clients.registry import RegistryClient, RegistryPool
from tests.registry.imagepush import ImageSpec, good_labels
from tests.registry.test_validate_image import HARBOR, REV, RecordingSleep, expected, push_index


class CountingTransport(httpx.AsyncBaseTransport):
    """The real HTTP transport, recording every request that reaches the network."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.sent: list[httpx.Request] = []
        self.connections_opened = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def _validate(handle, repo, tag, pool, transport):
    return await validate_image(image_repository=f"{handle.host}/{repo}", tag=tag, expected=expected(),
                                credentials=handle.credentials, insecure_hosts=[handle.host], pool=pool,
                                transport=transport, sleep=RecordingSleep())


async def test_token_mode_validation_stays_within_six_registry_requests(token_registry):
    token_registry.set_public("lab/pool-pub", True)
    await push_index(token_registry, "lab/pool-pub", "v1", [
        ImageSpec("linux/amd64", labels=good_labels(REV, HARBOR), seed="p1"),
        ImageSpec("linux/arm64", labels=good_labels(REV, HARBOR), seed="p2")])
    transport = CountingTransport()
    pool = RegistryPool(transport=transport)
    try:
        report = await _validate(token_registry, "lab/pool-pub", "v1", pool, transport)
    finally:
        await pool.aclose()
    assert report.ok, report.failures()
    registry_port = httpx.URL(token_registry.url).port
    to_registry = [r for r in transport.sent if r.url.port == registry_port and r.url.path.startswith("/v2/")]
    to_token = [r for r in transport.sent if r not in to_registry]
    # GET tag (401, then 200 with a token), GET platform child, GET config, anonymous GET (401, then 200).
    assert len(to_registry) <= 6, [f"{r.method} {r.url.path}" for r in to_registry]
    assert not any(r.method == "HEAD" for r in to_registry)
    assert len(to_token) == 2  # one pull token for the credentials, one anonymous token
    assert "authorization" not in {k.lower() for k in to_token[-1].headers}  # the anonymous token request


async def test_validations_share_one_client_per_registry(token_registry, open_registry):
    token_registry.set_public("lab/pool-share", True)
    await push_index(token_registry, "lab/pool-share", "v1", [
        ImageSpec("linux/amd64", labels=good_labels(REV, HARBOR), seed="s1")])
    await push_index(open_registry, "lab/pool-share", "v1", [
        ImageSpec("linux/amd64", labels=good_labels(REV, HARBOR), seed="s2")])
    pool = RegistryPool()
    try:
        for _ in range(3):
            assert (await _validate(token_registry, "lab/pool-share", "v1", pool, None)).ok
            assert (await _validate(open_registry, "lab/pool-share", "v1", pool, None)).ok
    finally:
        await pool.aclose()
    # Authenticated reads and anonymous probes of both registries: one client per registry origin.
    assert pool.clients_created == 2


async def test_anonymous_probe_never_sends_cookies_or_credentials_from_the_pool():
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, headers={"set-cookie": "session=from-authenticated-read; Path=/",
                                            "content-type": "application/json"}, content=b"{}")

    pool = RegistryPool(transport=httpx.MockTransport(handler))
    try:
        authed = RegistryClient("reg.example", credentials=("u", "sentinel-secret"), pool=pool)
        await authed._send("GET", "https://reg.example/v2/", auth="Basic c2VudGluZWw=")
        await authed.aclose()  # borrowed connections stay open for the next client
        anon = RegistryClient("reg.example", credentials=None, pool=pool)
        await anon._send("GET", "https://reg.example/v2/")
    finally:
        await pool.aclose()
    assert "cookie" not in seen[1].headers and "authorization" not in seen[1].headers
    assert pool.clients_created == 1


async def test_the_worker_warms_the_pool_at_start_so_the_first_validation_is_not_cold(token_registry, tmp_path,
                                                                                     monkeypatch):
    """``BuildActivities.warm_registry`` (run by worker.py at start) opens the connection and fetches the
    push identity's pull token; the first validation then asks the token endpoint only for the anonymous
    probe and skips the authenticated 401 round trip — exactly what a later validation costs."""
    from activities.build import BuildActivities
    from domain.config import ServiceConfig

    repo = "lab/pool-warm"
    token_registry.set_public(repo, True)
    await push_index(token_registry, repo, "v1", [ImageSpec("linux/amd64", labels=good_labels(REV, HARBOR), seed="w1")])
    user, secret = token_registry.credentials
    monkeypatch.setenv("GPU_RL_TEST_REGISTRY_TOKEN", secret)
    config = ServiceConfig.model_validate({
        "work_dir": str(tmp_path),
        "repos": {"marinskyrl_url": "file:///nowhere", "harbor_url": "file:///nowhere"},
        "clusters": {"c": {"controller_url": "http://127.0.0.1:9", "client_revision_date": "2026-12-01"}},
        "registry": {"image_repository": f"{token_registry.host}/{repo}", "insecure_hosts": [token_registry.host],
                     "user": {"kind": "literal_public", "value": user},
                     "token": {"kind": "env", "name": "GPU_RL_TEST_REGISTRY_TOKEN"}},
    })
    transport = CountingTransport()
    acts = BuildActivities(config)
    acts.registry_pool = RegistryPool(transport=transport)
    try:
        warmed = await acts.warm_registry()
        assert "pull token" in warmed, warmed
        transport.sent.clear()
        report = await _validate(token_registry, repo, "v1", acts.registry_pool, transport)
    finally:
        await acts.registry_pool.aclose()
    assert report.ok, report.failures()
    registry_port = httpx.URL(token_registry.url).port
    to_token = [r for r in transport.sent if r.url.port != registry_port or not r.url.path.startswith("/v2/")]
    assert len(to_token) == 1  # the anonymous probe's own token only: the pull token came from the warm-up
    assert "authorization" not in {k.lower() for k in to_token[0].headers}
    assert acts.registry_pool.clients_created == 1
