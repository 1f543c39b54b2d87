"""clusters.<name>.token: a controller that requires a bearer gets it on every request, read from its
credential source when the client opens — never stored in the configuration, a plan or a repr — and
without one the request carries no Authorization header (a controller treats a tokenless loopback
request, i.e. through kubectl port-forward, as an anonymous admin)."""

from __future__ import annotations

import httpx

from activities.common import iris_client
from domain.config import ServiceConfig
from domain.redact import redact

SENTINEL = "iris-bearer-sentinel-7f3a9c"


def _config(token: dict | None) -> ServiceConfig:
    cluster = {"controller_url": "https://iris.invalid:10000", "client_revision_date": "2026-11-20"}
    if token:
        cluster["token"] = token
    return ServiceConfig.model_validate({
        "work_dir": "/tmp/unused", "repos": {"marinskyrl_url": "file:///x.git", "harbor_url": "file:///y.git"},
        "clusters": {"cw-rno2a": cluster},
        "registry": {"image_repository": "ghcr.io/acme/images", "user": {"kind": "literal_public", "value": "u"},
                     "token": {"kind": "env", "name": "UNUSED"}}})


async def _authorization(config: ServiceConfig) -> list[str | None]:
    seen: list[str | None] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return httpx.Response(200, json={"status": "ok"})

    async with iris_client(config, "cw-rno2a", transport=httpx.MockTransport(handle)) as iris:
        assert await iris.health()
        assert SENTINEL not in repr(iris)
    return seen


async def test_the_cluster_token_is_sent_as_a_bearer_and_never_stored(monkeypatch):
    monkeypatch.setenv("IRIS_TOKEN_TEST", SENTINEL)
    config = _config({"kind": "env", "name": "IRIS_TOKEN_TEST"})
    assert await _authorization(config) == [f"Bearer {SENTINEL}"]
    assert SENTINEL not in config.model_dump_json()
    assert "clusters.cw-rno2a.token" in config.credential_sources()  # preflight reads it; redaction learns it
    assert redact(f"token={SENTINEL}") != f"token={SENTINEL}"


async def test_without_a_token_the_request_is_anonymous():
    assert await _authorization(_config(None)) == [None]
