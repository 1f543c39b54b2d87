"""The local registry launcher: modes, visibility toggle, fault proxy, clean stop."""

from __future__ import annotations

import os

import httpx
import pytest

from sandbox.registry import TOKEN_SERVICE, start_registry


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_start_and_stop_leave_no_process(tmp_path):
    handle = start_registry(tmp_path, "open", fault_proxy=True)
    assert httpx.get(f"{handle.url}/v2/", trust_env=False).status_code == 200
    assert handle.host.startswith("127.0.0.1:") and handle.host != handle.registry_host
    pid = handle.pid
    handle.stop()
    handle.stop()  # idempotent
    assert not _alive(pid)


def test_open_registry_answers_without_auth(open_registry):
    resp = httpx.get(f"{open_registry.url}/v2/", trust_env=False)
    assert resp.status_code == 200
    assert open_registry.credentials is None


def test_htpasswd_registry_sends_basic_challenge_and_accepts_push_user(htpasswd_registry):
    anon = httpx.get(f"{htpasswd_registry.url}/v2/", trust_env=False)
    assert anon.status_code == 401
    assert anon.headers["www-authenticate"].lower().startswith("basic")
    assert httpx.get(f"{htpasswd_registry.url}/v2/", auth=htpasswd_registry.credentials,
                     trust_env=False).status_code == 200
    assert httpx.get(f"{htpasswd_registry.url}/v2/", auth=("sandbox-pusher", "wrong"),
                     trust_env=False).status_code == 401


def test_token_server_is_ghcr_like(token_registry):
    def token(repo, auth=None, actions="pull"):
        return httpx.get(token_registry.token_url, auth=auth, trust_env=False,
                         params={"service": TOKEN_SERVICE, "scope": f"repository:{repo}:{actions}"})

    private = token("lab/private-x")
    assert private.status_code == 401
    assert private.json()["errors"][0]["code"] == "UNAUTHORIZED"
    assert token("lab/private-x", auth=token_registry.credentials, actions="pull,push").status_code == 200
    assert token("lab/private-x", auth=(token_registry.push_user, "nope")).status_code == 401
    token_registry.set_public("lab/private-x", True)
    try:
        assert token("lab/private-x").status_code == 200
    finally:
        token_registry.set_public("lab/private-x", False)
    # the admin endpoint does the same from another process
    httpx.post(token_registry.admin_url, params={"repo": "lab/admin-x", "public": "1"}, trust_env=False)
    assert token_registry.is_public("lab/admin-x")
    assert token("lab/admin-x").status_code == 200


def test_push_token_not_in_repr_or_config(token_registry):
    assert token_registry.push_token not in repr(token_registry)
    assert token_registry.push_token not in (token_registry.state_dir / "config.yml").read_text()


def test_fault_proxy_serves_queued_faults_then_passes(tmp_path):
    with start_registry(tmp_path, "open", fault_proxy=True) as handle:
        handle.inject(429, 2, retry_after=3)
        first = httpx.get(f"{handle.url}/v2/", trust_env=False)
        assert (first.status_code, first.headers["retry-after"]) == (429, "3")
        assert first.json()["errors"][0]["code"] == "TOOMANYREQUESTS"
        httpx.post(handle.fault_url, params={"status": 503, "count": 1}, trust_env=False)
        assert httpx.get(f"{handle.url}/v2/", trust_env=False).status_code == 503
        assert httpx.get(f"{handle.url}/v2/", trust_env=False).status_code == 200
        assert handle.faults_served == 2


def test_set_public_refused_outside_token_mode(open_registry):
    with pytest.raises(ValueError):
        open_registry.set_public("x/y", True)
