"""GitHub App installation tokens: App id + installation id + the App's private key → a short-lived token.

Why: an installation token carries only the permissions the App was granted on the repositories it is
installed on, and expires within an hour; the one long-lived secret is the private key, which never
leaves this module (it signs a JWT and is dropped). PyJWT signs the JWT (RS256, the algorithm GitHub
requires) — a well-kept library rather than hand-built JOSE. The token is cached per installation until
``refresh_margin_s`` before its expiry and minted again after, so a long PR watch keeps working.

Errors name the configuration key (``github.app.private_key``, ``github.app.app_id``,
``github.app.installation_id``), never the key, the JWT or the token.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import httpx
import jwt

from clients import http_guard
from clients.credentials import CredentialError, fetch_secret
from clients.github import API_VERSION, GitHubError, GitHubUnavailable
from domain.config import GitHubAppSettings
from domain.credential_hosts import host_of
from domain.redact import register_secret

JWT_LIFETIME_S = 540  # GitHub accepts at most 10 minutes; stay under it with clock drift
JWT_BACKDATE_S = 60  # GitHub's advice against clock drift
MAX_TOKEN_REPLY_BYTES = 256 * 1024  # an installation token and its permissions: a few KB


class AppTokenError(CredentialError):
    """GitHub refused to mint an installation token; the message names the configuration key to fix."""


@dataclass(frozen=True)
class InstallationToken:
    token: str = field(repr=False)
    expires_at: datetime
    permissions: dict[str, str]  # e.g. {"contents": "write", "checks": "read"}: what GitHub granted


def register_private_key(pem: str) -> None:
    """Redact the whole key and each of its base64 lines (a log that cut the PEM still leaks nothing)."""
    register_secret(pem)
    for line in pem.splitlines():
        if len(line.strip()) >= 16 and not line.startswith("-----"):
            register_secret(line.strip())


class InstallationTokenProvider:
    """``provider()`` → a valid installation token (cached; minted again near expiry). Thread-safe."""

    def __init__(self, api_url: str, app: GitHubAppSettings, *, refresh_margin_s: float = 300.0,
                 transport: httpx.BaseTransport | None = None, clock: Callable[[], float] = time.time,
                 timeout_s: float = 30.0):
        self.api_url = api_url.rstrip("/")
        self.app = app
        self.refresh_margin_s = refresh_margin_s
        self._transport = transport
        self._clock = clock
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._cached: InstallationToken | None = None
        self.minted = 0  # how many tokens this provider asked GitHub for

    def __repr__(self) -> str:
        return f"InstallationTokenProvider(app_id={self.app.app_id!r}, installation_id={self.app.installation_id})"

    def __call__(self) -> str:
        return self.current().token

    def current(self) -> InstallationToken:
        with self._lock:
            cached = self._cached
            if cached is None or cached.expires_at.timestamp() - self.refresh_margin_s <= self._clock():
                self._cached = cached = self._mint()
            return cached

    def _jwt(self) -> str:
        pem = fetch_secret(self.app.private_key, what="github.app.private_key")
        register_private_key(pem)
        now = int(self._clock())
        try:
            token = jwt.encode({"iat": now - JWT_BACKDATE_S, "exp": now + JWT_LIFETIME_S, "iss": str(self.app.app_id)},
                               pem, algorithm="RS256")
        except (ValueError, TypeError, jwt.PyJWTError) as e:  # the message of a bad key never quotes it
            raise AppTokenError(f"github.app.private_key ({self.app.private_key.describe()}): not an RSA private "
                                f"key in PEM form ({type(e).__name__}); download the App's key again") from None
        finally:
            del pem
        register_secret(token)
        return token

    def _mint(self) -> InstallationToken:
        path = f"/app/installations/{self.app.installation_id}/access_tokens"
        headers = {"Authorization": f"Bearer {self._jwt()}", "Accept": "application/vnd.github+json",
                   "X-GitHub-Api-Version": API_VERSION, "User-Agent": "gpu-rl-builder"}
        try:
            with http_guard.sync_client(allowed_hosts=(host_of(self.api_url),), credential="github.app.private_key",
                                        max_body_bytes=MAX_TOKEN_REPLY_BYTES, base_url=self.api_url,
                                        transport=self._transport, timeout=self._timeout_s) as http:
                resp = http.post(path, headers=headers)
        except (http_guard.ResponseTooLarge, http_guard.CredentialRefused) as e:  # not transient
            raise GitHubError(str(e), method="POST", path=path) from None
        except httpx.HTTPError as e:  # from None: the request (and its JWT) stays out of the error
            raise GitHubUnavailable(f"{type(e).__name__}: minting an installation token", method="POST",
                                    path=path) from None
        self.minted += 1
        try:
            data = resp.json()
        except ValueError:
            data = {}
        message = str(data.get("message") or resp.reason_phrase) if isinstance(data, dict) else resp.reason_phrase
        app, inst = self.app.app_id, self.app.installation_id
        if resp.status_code == 401:
            raise AppTokenError(f"github.app: GitHub refused the App's JWT (401 {message}): github.app.private_key is "
                                f"not the key of app github.app.app_id = {app}, or it was revoked")
        if resp.status_code == 404:
            raise AppTokenError(f"github.app.installation_id = {inst}: app {app} has no such installation (404 "
                                f"{message}); install the App on the repositories and copy the installation id")
        if resp.status_code == 403:
            raise AppTokenError(f"github.app: installation {inst} of app {app} may not mint tokens (403 {message}); "
                                "the installation is suspended or the App lacks the permissions")
        if not resp.is_success:
            raise GitHubError(message, status=resp.status_code, method="POST", path=path)
        token = data["token"]
        register_secret(token)
        expires = datetime.fromisoformat(str(data["expires_at"]).replace("Z", "+00:00")).astimezone(UTC)
        return InstallationToken(token=token, expires_at=expires,
                                 permissions={str(k): str(v) for k, v in (data.get("permissions") or {}).items()})


_providers: dict[tuple[str, str, int, str], InstallationTokenProvider] = {}
_providers_lock = threading.Lock()


def installation_provider(api_url: str, app: GitHubAppSettings) -> InstallationTokenProvider:
    """The worker-wide provider of one installation, so every activity shares its cached token."""
    key = (api_url.rstrip("/"), str(app.app_id), app.installation_id, app.private_key.describe())
    with _providers_lock:
        provider = _providers.get(key)
        if provider is None:
            provider = _providers[key] = InstallationTokenProvider(api_url, app)
        return provider
