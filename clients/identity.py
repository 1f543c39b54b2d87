"""Whose credential is it: each identity is read from its own token, never from another secret.

Why its own module: the registry user (the Docker login of the image push) and the GitHub identity
(the PR, the issue comment) come from two different credentials. ``token_owner`` resolves the registry
user with ``GET /user`` called with the *registry* token itself; the GitHub side is a token or a GitHub
App installation (clients/github_app.py). ``token_identity`` also reads what a token may do: a classic
token's scopes come back in GitHub's ``X-OAuth-Scopes`` header; fine-grained and installation tokens
have no such header (their permissions are probed by preflight).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import httpx

from clients import http_guard
from clients.credentials import CredentialError, fetch_secret
from clients.git_source import GitCredential
from clients.github import API_VERSION, GitHubError, GitHubUnavailable
from clients.github_app import installation_provider
from domain.config import GitHubSettings, ServiceConfig
from domain.credential_hosts import host_of
from domain.git_credential import github_git_origin

TokenKind = Literal["classic", "fine-grained", "installation"]


@dataclass(frozen=True)
class TokenIdentity:
    login: str | None  # None: an installation token (no user behind it)
    kind: TokenKind
    scopes: frozenset[str] | None  # a classic token's X-OAuth-Scopes; None when GitHub sends none

    def lacks(self, *alternatives: str) -> bool:
        """True when a classic token has none of ``alternatives`` (e.g. ``repo`` or ``public_repo``)."""
        return self.scopes is not None and not (self.scopes & set(alternatives))


class IdentityError(CredentialError):
    """GitHub refused to say whose token this is; the message names the configuration key."""


def token_identity(api_url: str, token: str, *, what: str, transport: httpx.BaseTransport | None = None,
                   timeout_s: float = 30.0) -> TokenIdentity:
    """``GET <api_url>/user`` with ``token``: its login, kind and (classic) scopes."""
    url = f"{api_url.rstrip('/')}/user"
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/vnd.github+json",
               "X-GitHub-Api-Version": API_VERSION, "User-Agent": "gpu-rl-builder"}
    try:
        with http_guard.sync_client(allowed_hosts=(host_of(api_url),), credential=what, max_body_bytes=256 * 1024,
                                    transport=transport, timeout=timeout_s) as http:
            resp = http.get(url, headers=headers)
    except (http_guard.ResponseTooLarge, http_guard.CredentialRefused) as e:  # not transient
        raise IdentityError(f"{what}: {e}") from None
    except httpx.HTTPError as e:  # from None: the request carries the token
        raise GitHubUnavailable(f"{type(e).__name__}: reading the owner of {what}", method="GET", path="/user") from None
    try:
        data = resp.json()
    except ValueError:
        data = {}
    message = str(data.get("message") or resp.reason_phrase) if isinstance(data, dict) else resp.reason_phrase
    if resp.status_code == 403 and "integration" in message.lower():
        return TokenIdentity(login=None, kind="installation", scopes=None)
    if resp.status_code == 401:
        raise IdentityError(f"{what}: GET {url} answered 401 {message}: the token is invalid or expired")
    if resp.status_code >= 500 or resp.status_code == 429:
        raise GitHubError(message, status=resp.status_code, method="GET", path="/user")
    if not resp.is_success or not isinstance(data, dict) or not data.get("login"):
        raise IdentityError(f"{what}: GET {url} answered {resp.status_code} {message}: cannot tell whose token it is")
    header = resp.headers.get("x-oauth-scopes")
    scopes = None if header is None else frozenset(s.strip() for s in header.split(",") if s.strip())
    return TokenIdentity(login=str(data["login"]), kind="classic" if header is not None else "fine-grained",
                         scopes=scopes)


_owners: dict[tuple[str, str], str] = {}  # (api url, sha256 of the registry token) -> login
_owners_lock = threading.Lock()


def registry_user(config: ServiceConfig, token: str | None = None, *,
                  transport: httpx.BaseTransport | None = None) -> str:
    """The registry user: its configured value, or (``token_owner``) the login that owns registry.token.

    A ``token_owner`` login is cached per token value (a rotated token is looked up again)."""
    source = config.registry.user
    if source.kind != "token_owner":
        return fetch_secret(source, what="registry.user")
    token = token if token is not None else fetch_secret(config.registry.token, what="registry.token")
    api = config.registry_user_api_url()
    key = (api, hashlib.sha256(token.encode()).hexdigest())
    with _owners_lock:
        if key in _owners:
            return _owners[key]
    ident = token_identity(api, token, what="registry.token", transport=transport)
    if ident.login is None:
        raise IdentityError("registry.user: registry.token is a GitHub App installation token, which has no user "
                            "(GET /user: 403); set registry.user explicitly")
    with _owners_lock:
        _owners[key] = ident.login
    return ident.login


def github_auth(gh: GitHubSettings) -> str | Callable[[], str]:
    """What ``GitHubClient`` authenticates with: the configured token, or the App installation's provider
    (a callable that mints and refreshes short-lived tokens)."""
    if gh.app is not None:
        return installation_provider(gh.api_url, gh.app)
    assert gh.token is not None  # GitHubSettings requires one of the two
    return fetch_secret(gh.token, what="github.token")



def git_credential(config: ServiceConfig) -> GitCredential | None:
    """git's credential: the [github] identity (github.token, or an installation token of github.app),
    bound to that GitHub's own host (github.web_url, else github.api_url's). None without [github]."""
    gh = config.github
    if gh is None:
        return None
    origin, bound_by = github_git_origin(gh.api_url, gh.web_url)
    if gh.app is not None:
        app = gh.app
        return GitCredential(
            config_key="github.app", source=f"an installation token of app {app.app_id}, installation "
            f"{app.installation_id}", origin=origin, bound_by=bound_by, token=installation_provider(gh.api_url, app),
            fix=f"install the App on this repository (github.app.installation_id = {app.installation_id}) and "
            "grant it Contents: write")
    source = gh.token
    assert source is not None  # GitHubSettings requires one of the two
    return GitCredential(
        config_key="github.token", source=source.describe(), origin=origin, bound_by=bound_by,
        token=lambda: fetch_secret(source, what="github.token"),
        fix="the token is invalid, expired or lacks Contents: write on the repository; replace it")
