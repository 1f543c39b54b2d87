"""Each identity from its own credential, against the GitHub stand-in: the registry user is the registry
token's owner (not the GitHub token's), a GitHub App installation token is minted from the App's key,
cached, refreshed near expiry and limited to its permissions, and the key never shows in an error."""

from __future__ import annotations

import logging
import time
import uuid
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from clients.credentials import CredentialError
from clients.github import Forbidden, GitHubClient
from clients.github_app import AppTokenError, InstallationTokenProvider
from clients.identity import registry_user, token_identity
from domain.config import ConfigError, CredentialSource, GitHubAppSettings, ServiceConfig, load_config
from domain.redact import redact

ALL = {"contents": "write", "pull_requests": "write", "issues": "write", "checks": "read", "statuses": "read",
       "metadata": "read"}


def rsa_key_pair() -> tuple[str, str]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    return private, public


def _file(tmp_path: Path, name: str, value: str) -> CredentialSource:
    path = tmp_path / name
    path.write_text(value)
    return CredentialSource(kind="file", path=str(path))


def _config(api_url: str, *, user: dict, registry_token: CredentialSource, github: dict) -> ServiceConfig:
    return ServiceConfig.model_validate({
        "work_dir": "/tmp/unused", "repos": {"marinskyrl_url": "file:///x.git", "harbor_url": "file:///y.git"},
        "clusters": {"c": {"controller_url": "http://127.0.0.1:1", "client_revision_date": "2026-11-20"}},
        "registry": {"image_repository": "ghcr.io/acme/images", "user": user,
                     "token": registry_token.model_dump(exclude_none=True)},
        "github": {"api_url": api_url, **github}})


def test_the_registry_user_is_the_registry_tokens_owner_not_the_github_tokens(github_standin, tmp_path):
    gh = github_standin
    registry_token = "ghp_registry" + "r" * 30
    gh.handle.add_token(registry_token, "ghcr-pusher", scopes=["write:packages", "read:packages"])
    config = _config(gh.api_url, user={"kind": "token_owner"},
                     registry_token=_file(tmp_path, "ghcr-token", registry_token),
                     github={"token": {"kind": "file", "path": str(_file(tmp_path, "gh", gh.token).path)}})
    assert registry_user(config) == "ghcr-pusher"
    github_owner = token_identity(gh.api_url, gh.token, what="github.token")
    assert github_owner.login == "gpu-rl-builder-bot" != "ghcr-pusher"
    ident = token_identity(gh.api_url, registry_token, what="registry.token")
    assert ident.kind == "classic" and ident.scopes == {"write:packages", "read:packages"}
    assert not ident.lacks("write:packages") and ident.lacks("repo")
    # A registry token GitHub refuses is named; its value is not.
    refused = "ghp_" + uuid.uuid4().hex + uuid.uuid4().hex[:4]  # random: a redactor that learns it hides no other text
    bad = _config(gh.api_url, user={"kind": "token_owner"}, registry_token=_file(tmp_path, "bad", refused),
                  github={"token": {"kind": "env", "name": "UNUSED"}})
    with pytest.raises(CredentialError, match="registry.token: GET .*/user answered 401") as info:
        registry_user(bad)
    assert refused[4:] not in str(info.value)


def test_identity_sources_are_refused_where_they_would_borrow_another_secret(tmp_path):
    text = """
work_dir = "/tmp/w"
[repos]
marinskyrl_url = "file:///x.git"
harbor_url = "file:///y.git"
[clusters.c]
controller_url = "http://127.0.0.1:1"
client_revision_date = "2026-11-20"
[registry]
image_repository = "ghcr.io/acme/images"
user = {kind = "command", argv = ["gh", "api", "user", "--jq", ".login"]}
token = {kind = "file", path = "/run/ghcr-token"}
[github]
app = {app_id = "123", installation_id = 45, private_key = {kind = "file", path = "/run/app.pem"}}
"""
    path = tmp_path / "config.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"registry.user: with github.app .* configure the registry user explicitly"):
        load_config(path)
    path.write_text(text.replace('{kind = "command", argv = ["gh", "api", "user", "--jq", ".login"]}',
                                 '{kind = "literal_public", value = "ghcr-pusher"}'))
    assert load_config(path).github.app.installation_id == 45
    path.write_text(text.replace("app = {", 'token = {kind = "env", name = "T"}\napp = {'))
    with pytest.raises(ConfigError, match="exactly one of github.token"):
        load_config(path)
    path.write_text(text.replace('token = {kind = "file", path = "/run/ghcr-token"}', 'token = {kind = "token_owner"}'))
    with pytest.raises(ConfigError, match="registry.token: kind 'token_owner' only applies to registry.user"):
        load_config(path)


async def test_an_installation_token_is_minted_cached_refreshed_and_limited(github_standin, tmp_path):
    """The provider's clock is the test's: refreshing near expiry is decided by it, not by how long the
    requests took on a loaded machine (a 2.5 s TTL with a 1 s margin minted a third token under load)."""
    gh = github_standin
    private, public = rsa_key_pair()
    gh.handle.register_app("4242", public, 77, permissions={**ALL, "checks": "none"}, ttl_s=120)
    app = GitHubAppSettings(app_id="4242", installation_id=77, private_key=_file(tmp_path, "app.pem", private))
    now = [time.time()]
    provider = InstallationTokenProvider(gh.api_url, app, refresh_margin_s=100, clock=lambda: now[0])
    first = provider.current()
    assert first.token.startswith("ghs_") and first.permissions["contents"] == "write"
    assert provider() == first.token and gh.handle.installation_tokens_minted() == 1  # cached
    async with GitHubClient(gh.api_url, provider, gh.repo) as client:
        assert (await client.repo_permissions())["push"]
        comment = await client.comment_issue(3, "from the App")
        assert comment.body == "from the App"
        with pytest.raises(Forbidden, match="Resource not accessible by integration"):
            await client.check_runs("main")  # the installation has no checks permission
        assert gh.handle.installation_tokens_minted() == 1  # still cached: far from expiry
        # Inside the refresh margin (and close enough to GitHub's clock for the App's JWT to be accepted):
        now[0] = first.expires_at.timestamp() - 99
        assert (await client.repo_permissions())["push"]
    assert gh.handle.installation_tokens_minted() == 2 and provider() != first.token
    gh.handle.expire_token(first.token)  # the first token's life has ended at GitHub
    async with GitHubClient(gh.api_url, first.token, gh.repo) as stale:
        with pytest.raises(Exception, match="401"):
            await stale.repo_permissions()
    ident = token_identity(gh.api_url, provider(), what="github.token")
    assert ident.kind == "installation" and ident.login is None  # GET /user: 403, no user behind it


def test_app_errors_name_the_key_to_fix_and_never_the_private_key(github_standin, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    gh = github_standin
    private, public = rsa_key_pair()
    other, _ = rsa_key_pair()
    gh.handle.register_app("5151", public, 8, permissions=ALL)
    key_file = _file(tmp_path, "app.pem", other)  # not the App's key
    wrong = InstallationTokenProvider(gh.api_url, GitHubAppSettings(app_id="5151", installation_id=8, private_key=key_file))
    with pytest.raises(AppTokenError, match="github.app.private_key is not the key of app github.app.app_id = 5151") as e1:
        wrong()
    missing = InstallationTokenProvider(gh.api_url, GitHubAppSettings(
        app_id="5151", installation_id=9, private_key=_file(tmp_path, "good.pem", private)))
    with pytest.raises(AppTokenError, match="github.app.installation_id = 9: app 5151 has no such installation") as e2:
        missing()
    garbage = InstallationTokenProvider(gh.api_url, GitHubAppSettings(
        app_id="5151", installation_id=8, private_key=_file(tmp_path, "garbage.pem", "-----BEGIN RSA PRIVATE KEY-----\n"
                                                            "c2VudGluZWwtbm90LWEta2V5LXNlbnRpbmVs\n-----END RSA PRIVATE KEY-----\n")))
    with pytest.raises(AppTokenError, match="github.app.private_key .* not an RSA private key") as e3:
        garbage()
    lines = [ln for pem in (private, other) for ln in pem.splitlines() if not ln.startswith("-----")]
    seen = " ".join([str(e1.value), str(e2.value), str(e3.value), caplog.text])
    assert "c2VudGluZWwtbm90LWEta2V5LXNlbnRpbmVs" not in seen
    assert not [ln for ln in lines if ln in seen]
    # Registered for redaction, each line too: a log that printed part of the key shows none of it.
    assert lines[5] not in redact(f"oops: {lines[5]}") and "[REDACTED]" in redact(f"oops: {lines[5]}")
