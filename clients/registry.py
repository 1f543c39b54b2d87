"""A thin async OCI distribution client (httpx): challenge, token, manifests by raw bytes, blobs.

Why our own: the validator needs the raw manifest bytes (digest = sha256 of them), full control of
``Accept`` (a missing type silently changes the digest), and to know *which* auth step failed (token
endpoint vs registry) to tell "private" from "rate limited". Secrets live only in request headers:
never in errors, reprs or logs.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import email.utils
import hashlib
import http.cookiejar
import ipaddress
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from clients import http_guard
from domain.credential_hosts import host_of, is_loopback_host
from domain.validation import MANIFEST_ACCEPT

MAX_MANIFEST_BYTES = 4 * 1024 * 1024
MAX_BLOB_BYTES = 64 * 1024 * 1024
MAX_REPLY_BYTES = 1024 * 1024  # any other reply: /v2/, errors, a HEAD, a token (a JWT of a few KB)
_AUTH_PARAM = re.compile(r'(\w+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^,\s]*))')
_DIGEST = re.compile(r"^(sha256|sha384|sha512):[0-9a-f]+$")

AuthStep = Literal["token", "registry"]


# --- errors ----------------------------------------------------------------------------------------


class RegistryError(Exception):
    """Base error; ``step`` says whether the token endpoint or the registry answered."""

    def __init__(self, message: str, *, status: int | None = None, step: AuthStep = "registry",
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.step = step
        self.code = code


class Unauthorized(RegistryError):
    """401: no or insufficient credentials (``scheme``/``error`` come from the challenge)."""

    def __init__(self, message: str, *, scheme: str | None = None, error: str | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.scheme = scheme
        self.error = error


class Denied(RegistryError):
    """403: credentials were accepted but lack access."""


class NotFound(RegistryError):
    """404: MANIFEST_UNKNOWN, NAME_UNKNOWN or BLOB_UNKNOWN (see ``code``)."""


class RateLimited(RegistryError):
    """429 still answered after the bounded retries."""

    def __init__(self, message: str, *, retry_after: float | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after = retry_after


class RegistryUnavailable(RegistryError):
    """5xx or a network error after the bounded retries: transient, never a verdict on visibility."""


class DigestMismatch(RegistryError):
    """The bytes do not hash to the digest asked for or announced."""


class ProtocolError(RegistryError):
    """The registry answered something this client refuses (bad challenge, realm, media type, size)."""


# --- value types -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Challenge:
    scheme: str  # "bearer" | "basic" (lower case)
    params: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ManifestRef:
    digest: str
    media_type: str
    size: int | None


@dataclass(frozen=True)
class RawManifest:
    data: bytes
    media_type: str
    digest: str

    def __repr__(self) -> str:
        return f"RawManifest(media_type={self.media_type!r}, digest={self.digest!r}, size={len(self.data)})"


def parse_www_authenticate(header: str | None) -> Challenge | None:
    """Parse ``Bearer realm="…",service="…",scope="a:b:pull,push"`` or ``Basic realm="…"``."""
    if not header or not header.strip():
        return None
    scheme, _, rest = header.strip().partition(" ")
    params: dict[str, str] = {}
    for m in _AUTH_PARAM.finditer(rest):
        value = m.group(2) if m.group(2) is not None else m.group(3)
        params[m.group(1).lower()] = re.sub(r"\\(.)", r"\1", value)
    return Challenge(scheme=scheme.lower(), params=params)


def compute_digest(data: bytes, algorithm: str = "sha256") -> str:
    return f"{algorithm}:{hashlib.new(algorithm, data).hexdigest()}"


def is_digest(ref: str) -> bool:
    return bool(_DIGEST.match(ref))


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from ``Retry-After`` (delta-seconds or HTTP date)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _error_code(resp: httpx.Response) -> str | None:
    try:
        errors = resp.json().get("errors") or []
        return str(errors[0].get("code")) if errors else None
    except (ValueError, AttributeError, IndexError):
        return None


def _is_private_host(host: str) -> bool:
    if host == "localhost" or (host.endswith(".localhost") and is_loopback_host(host, http_guard.resolve_host)):
        return True
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return ip.is_loopback or ip.is_private or ip.is_link_local


# --- the shared connection pool ----------------------------------------------------------------------


def _no_cookies() -> http.cookiejar.CookieJar:
    """A jar that keeps nothing: a shared pool must never carry state from an authenticated request
    (a registry cookie) into the anonymous probe."""
    return http.cookiejar.CookieJar(policy=http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))


class RegistryPool:
    """One ``httpx.AsyncClient`` (keep-alive connections and one SSL context) per registry origin and
    event loop, shared by every RegistryClient of a worker.

    Why: building an httpx client builds an SSL context (~15 ms), and a fresh client cannot reuse a
    connection; with two or more clients per validation that was most of the validation's wall time.
    The pool carries connections only: no credentials, no tokens and no cookies, so the anonymous
    probe stays credential-free while reusing the authenticated request's TCP/TLS connection.
    """

    def __init__(self, *, timeout_s: float = 30.0, transport: httpx.AsyncBaseTransport | None = None,
                 max_connections: int = 64, realm_hosts: tuple[str, ...] = ()) -> None:
        self.realm_hosts = tuple(realm_hosts)  # config:registry.token_realm_hosts
        self._timeout_s = timeout_s
        self._transport = transport
        self._limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._clients: dict[tuple[int, str, str], httpx.AsyncClient] = {}
        self._tokens: dict[tuple[str, str], dict[str, _Token]] = {}
        self.clients_created = 0  # for tests and benchmarks

    def http(self, scheme: str, host: str) -> httpx.AsyncClient:
        """The shared client for ``scheme://host`` in the running event loop (created on first use)."""
        key = (id(asyncio.get_running_loop()), scheme, host)
        client = self._clients.get(key)
        if client is None or client.is_closed:
            client = _guarded(host, self.realm_hosts, transport=self._transport, timeout=self._timeout_s,
                              trust_env=False, follow_redirects=False, limits=self._limits, cookies=_no_cookies())
            self._clients[key] = client
            self.clients_created += 1
        return client

    def tokens_for(self, host: str, credentials: tuple[str, str] | None) -> dict[str, _Token]:
        """Bearer tokens by scope, shared by the clients of one identity on one registry.

        Keyed by a fingerprint of the credentials, so a rotated secret starts afresh. Anonymous tokens
        are never shared: the visibility probe must ask the token endpoint itself every time, since a
        package's visibility can change between two validations.
        """
        if credentials is None:
            return {}
        fingerprint = hashlib.sha256("\0".join(credentials).encode()).hexdigest()
        return self._tokens.setdefault((host, fingerprint), {})

    async def aclose(self) -> None:
        loop = id(asyncio.get_running_loop())
        for key in [k for k in self._clients if k[0] == loop]:
            await self._clients.pop(key).aclose()


async def warm_pool(pool: RegistryPool, host: str, repo: str, *, scheme: Literal["https", "http"] = "https",
                    credentials: tuple[str, str] | None = None) -> str:
    """Open ``pool``'s connection to ``host`` (TCP, TLS, SSL context) and, with ``credentials``, fetch and
    cache their pull token for ``repo``, so the next validation costs what a later one does. Never
    raises: what could not be warmed is met again by the validation itself. Returns what was warmed."""
    client = RegistryClient(host, scheme=scheme, credentials=credentials, pool=pool, max_retries=0)
    try:
        if repo and credentials:
            with contextlib.suppress(NotFound):  # a 404 for the probe tag still brought the token
                await client.head_manifest(repo, "gpu-rl-builder-warm-up")
            return f"{scheme}://{host} connection and the pull token of {repo}"
        await client.ping()
        return f"{scheme}://{host} connection"
    except (RegistryError, httpx.HTTPError) as e:
        return f"nothing ({host}: {e or type(e).__name__})"
    finally:
        await client.aclose()


def _guarded(host: str, realm_hosts: tuple[str, ...], **kw: Any) -> httpx.AsyncClient:
    """The registry credential goes to the registry's own host (any port: a token server beside it) and to
    the configured realm hosts only, over TLS unless loopback (clients/http_guard.py)."""
    return http_guard.async_client(allowed_hosts=(host_of(f"https://{host}"), *realm_hosts),
                                   credential="registry.token", max_body_bytes=MAX_REPLY_BYTES, **kw)


# --- the client --------------------------------------------------------------------------------------


@dataclass
class _Token:
    value: str
    expires_at: float


class RegistryClient:
    """One registry host. ``credentials=None`` is an anonymous client (the visibility probe).

    With ``pool`` the client borrows the pool's connections (and does not close them); without it, it
    owns a private httpx client. Tokens are always this client's own.
    """

    def __init__(self, registry_host: str, *, scheme: Literal["https", "http"] = "https",
                 credentials: tuple[str, str] | None = None, transport: httpx.AsyncBaseTransport | None = None,
                 max_retries: int = 3, max_retry_after_s: float = 30.0, timeout_s: float = 30.0,
                 trusted_realm_hosts: tuple[str, ...] = (),
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 pool: RegistryPool | None = None) -> None:
        if scheme not in ("https", "http"):
            raise ValueError(f"scheme must be https or http, not {scheme!r}")
        self.host = registry_host
        self.scheme = scheme
        self._credentials = credentials
        self.max_retries = max_retries
        self.max_retry_after_s = max_retry_after_s
        self._trusted_realm_hosts = tuple(trusted_realm_hosts) + (pool.realm_hosts if pool is not None else ())
        self._sleep = sleep
        self._owns_http = pool is None
        self._http = pool.http(scheme, registry_host) if pool is not None else _guarded(
            registry_host, self._trusted_realm_hosts, transport=transport, timeout=timeout_s, trust_env=False,
            follow_redirects=False, cookies=_no_cookies())
        self._tokens: dict[str, _Token] = pool.tokens_for(registry_host, credentials) if pool else {}
        self._basic = False  # the registry asked for Basic auth
        self.token_requests = 0  # for tests and benchmarks: how often the token endpoint was hit

    def __repr__(self) -> str:
        creds = "set" if self._credentials else "anonymous"
        return f"RegistryClient(host={self.host!r}, scheme={self.scheme!r}, credentials={creds})"

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://{self.host}"

    @property
    def anonymous(self) -> bool:
        return self._credentials is None

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> RegistryClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- public API --

    async def ping(self) -> Challenge | None:
        """``GET /v2/``: None when no auth is needed, else the parsed challenge."""
        resp = await self._send("GET", f"{self.base_url}/v2/")
        if resp.status_code == 200:
            return None
        if resp.status_code == 401:
            challenge = parse_www_authenticate(resp.headers.get("www-authenticate"))
            if challenge is None:
                raise ProtocolError("401 from /v2/ without a WWW-Authenticate challenge", status=401)
            return challenge
        raise self._error(resp, "ping")

    async def check_push(self, repo: str) -> None:
        """Prove these credentials may push to ``repo``, leaving nothing behind: a token for
        ``pull,push``, then a blob upload that is started and cancelled at once. Raises Unauthorized or
        Denied when the registry refuses (a token server may silently grant less than asked)."""
        url = f"{self.base_url}/v2/{repo}/blobs/uploads/"
        resp = await self._request("POST", url, repo, actions="pull,push")
        if resp.status_code != 202:
            raise self._error(resp, f"push to {repo}")
        location = resp.headers.get("location")
        if location:
            await self._send("DELETE", str(httpx.URL(url).join(location)),
                             auth=self._auth_header(f"repository:{repo}:pull,push"))

    async def head_manifest(self, repo: str, ref: str) -> ManifestRef:
        """Resolve a tag (or digest) to the registry's digest without downloading the manifest."""
        url = f"{self.base_url}/v2/{repo}/manifests/{ref}"
        resp = await self._request("HEAD", url, repo, headers={"Accept": MANIFEST_ACCEPT})
        if resp.status_code != 200:
            raise self._error(resp, f"manifest {repo}:{ref}")
        digest = resp.headers.get("docker-content-digest")
        media_type = resp.headers.get("content-type", "").split(";")[0].strip()
        if not digest:  # older registries: fall back to hashing the body
            raw = await self.get_manifest(repo, ref)
            return ManifestRef(raw.digest, raw.media_type, len(raw.data))
        if not is_digest(digest):
            raise ProtocolError(f"malformed Docker-Content-Digest {digest!r}", status=200)
        if is_digest(ref) and digest != ref:
            raise DigestMismatch(f"HEAD {repo}@{ref} announced {digest}", status=200)
        length = resp.headers.get("content-length")
        return ManifestRef(digest, media_type, int(length) if length and length.isdigit() else None)

    async def get_manifest(self, repo: str, ref: str) -> RawManifest:
        """Raw manifest bytes; the digest is computed from them and cross-checked with the headers."""
        url = f"{self.base_url}/v2/{repo}/manifests/{ref}"
        resp = await self._request("GET", url, repo, headers={"Accept": MANIFEST_ACCEPT}, max_body=MAX_MANIFEST_BYTES)
        if resp.status_code != 200:
            raise self._error(resp, f"manifest {repo}:{ref}")
        data = resp.content
        if len(data) > MAX_MANIFEST_BYTES:
            raise ProtocolError(f"manifest {repo}:{ref} is {len(data)} bytes (cap {MAX_MANIFEST_BYTES})")
        media_type = resp.headers.get("content-type", "").split(";")[0].strip()
        announced = resp.headers.get("docker-content-digest")
        algorithm = "sha256"
        if is_digest(ref):
            algorithm = ref.split(":")[0]
        elif announced and is_digest(announced):
            algorithm = announced.split(":")[0]
        digest = compute_digest(data, algorithm)
        if is_digest(ref) and digest != ref:
            raise DigestMismatch(f"manifest {repo}@{ref} hashes to {digest}", status=200)
        if announced and announced.split(":")[0] == algorithm and announced != digest:
            raise DigestMismatch(f"manifest {repo}:{ref} hashes to {digest}, registry says {announced}",
                                 status=200)
        return RawManifest(data=data, media_type=media_type, digest=digest)

    async def get_blob(self, repo: str, digest: str, *, max_bytes: int = MAX_BLOB_BYTES) -> bytes:
        """Blob bytes (config JSON and the like), following redirects and verifying the digest."""
        if not is_digest(digest):
            raise ValueError(f"not a digest: {digest!r}")
        url = f"{self.base_url}/v2/{repo}/blobs/{digest}"
        resp = await self._request("GET", url, repo, follow_redirects=True, max_body=max_bytes)
        if resp.status_code != 200:
            raise self._error(resp, f"blob {repo}@{digest}")
        data = resp.content
        if len(data) > max_bytes:
            raise ProtocolError(f"blob {repo}@{digest} is {len(data)} bytes (cap {max_bytes})")
        if compute_digest(data, digest.split(":")[0]) != digest:
            raise DigestMismatch(f"blob {repo}@{digest} does not match its digest", status=200)
        return data

    async def download_blob(self, repo: str, digest: str, dest: Any, *, max_bytes: int) -> int:
        """Stream a blob (an image layer) to the open binary file ``dest``, verifying its digest; its size.

        Why streamed: layers are far larger than ``get_blob``'s in-memory cap. The token comes from a HEAD
        through the usual challenge; redirects (a CDN) get no Authorization, as in ``_send_once``."""
        if not is_digest(digest):
            raise ValueError(f"not a digest: {digest!r}")
        url = f"{self.base_url}/v2/{repo}/blobs/{digest}"
        head = await self._request("HEAD", url, repo, follow_redirects=True)
        if head.status_code != 200:
            raise self._error(head, f"blob {repo}@{digest}")
        for attempt in range(self.max_retries + 1):
            h = hashlib.new(digest.split(":")[0])
            dest.seek(0)
            dest.truncate()
            size = 0
            target, origin = httpx.URL(url), httpx.URL(self.base_url)
            try:
                for _ in range(6):
                    auth = self._auth_header(f"repository:{repo}:pull")
                    same = (target.scheme, target.host, target.port) == (origin.scheme, origin.host, origin.port)
                    headers = {"Authorization": auth} if auth and same else {}
                    async with self._http.stream("GET", target, headers=headers,
                                                 extensions={http_guard.BODY_CAP: max_bytes + 1}) as resp:
                        if resp.is_redirect and "location" in resp.headers:
                            target = target.join(resp.headers["location"])
                            continue
                        if resp.status_code != 200:
                            await resp.aread()
                            raise self._error(resp, f"blob {repo}@{digest}")
                        async for chunk in resp.aiter_bytes(1 << 20):
                            size += len(chunk)
                            if size > max_bytes:
                                raise ProtocolError(f"blob {repo}@{digest} exceeds {max_bytes} bytes")
                            h.update(chunk)
                            dest.write(chunk)
                        break
                else:
                    raise ProtocolError(f"too many redirects for blob {repo}@{digest}")
            except (http_guard.ResponseTooLarge, http_guard.CredentialRefused) as e:
                raise ProtocolError(str(e)) from None
            except httpx.TransportError as e:
                if attempt >= self.max_retries:
                    raise RegistryUnavailable(f"GET blob {repo}@{digest}: {type(e).__name__}") from None
                await self._sleep(min(0.2 * 2**attempt, self.max_retry_after_s))
                continue
            if f"{digest.split(':')[0]}:{h.hexdigest()}" != digest:
                raise DigestMismatch(f"blob {repo}@{digest} does not match its digest", status=200)
            dest.flush()
            return size
        raise AssertionError("unreachable")

    # -- request machinery --

    async def _request(self, method: str, url: str, repo: str, *, headers: dict[str, str] | None = None,
                       follow_redirects: bool = False, actions: str = "pull",
                       max_body: int = MAX_REPLY_BYTES) -> httpx.Response:
        """Send with cached auth; on a challenge authenticate once and resend."""
        scope = f"repository:{repo}:{actions}"
        sent = self._auth_header(scope)
        resp = await self._send(method, url, headers=headers, auth=sent, follow_redirects=follow_redirects,
                                max_body=max_body)
        if resp.status_code != 401:
            return resp
        challenge = parse_www_authenticate(resp.headers.get("www-authenticate"))
        if challenge is None:
            raise Unauthorized(f"401 for {repo} without a challenge", status=401)
        if challenge.scheme == "basic":
            if not self._credentials or self._basic:
                raise Unauthorized(f"registry requires Basic credentials for {repo}", status=401,
                                   scheme="basic", code=_error_code(resp))
            self._basic = True
        elif challenge.scheme == "bearer":
            if sent and sent.startswith("Bearer ") and challenge.params.get("error") == "insufficient_scope":
                raise Unauthorized(f"token for {repo} was refused ({challenge.params.get('error', 'no reason')})",
                                   status=401, scheme="bearer", error=challenge.params.get("error"),
                                   code=_error_code(resp))
            await self._fetch_token(challenge, scope)
        else:
            raise ProtocolError(f"unsupported auth scheme {challenge.scheme!r}", status=401)
        resp = await self._send(method, url, headers=headers, auth=self._auth_header(scope),
                                follow_redirects=follow_redirects, max_body=max_body)
        if resp.status_code == 401:
            again = parse_www_authenticate(resp.headers.get("www-authenticate"))
            raise Unauthorized(f"registry refused the credentials for {repo}", status=401,
                               scheme=again.scheme if again else None,
                               error=again.params.get("error") if again else None, code=_error_code(resp))
        return resp

    def _auth_header(self, scope: str) -> str | None:
        token = self._tokens.get(scope)
        if token and token.expires_at > time.monotonic():
            return f"Bearer {token.value}"
        if self._basic and self._credentials:
            return "Basic " + base64.b64encode(":".join(self._credentials).encode()).decode()
        return None

    async def _fetch_token(self, challenge: Challenge, scope: str) -> None:
        realm = challenge.params.get("realm")
        if not realm:
            raise ProtocolError("Bearer challenge without a realm", status=401)
        realm_url = httpx.URL(realm)
        self._check_realm(realm_url)
        params: list[tuple[str, str]] = [("scope", scope)]
        if challenge.params.get("service"):
            params.insert(0, ("service", challenge.params["service"]))
        send_creds = self._credentials and (realm_url.host == httpx.URL(self.base_url).host
                                            or realm_url.host in self._trusted_realm_hosts)
        auth = None
        if send_creds and self._credentials:
            auth = "Basic " + base64.b64encode(":".join(self._credentials).encode()).decode()
        self.token_requests += 1
        resp = await self._send("GET", str(realm_url.copy_merge_params(params)), auth=auth, auth_origin=realm_url)
        if resp.status_code == 401:
            raise Unauthorized(f"token endpoint refused {scope} ({'with' if auth else 'without'} credentials)",
                               status=401, step="token", scheme="bearer", code=_error_code(resp))
        if resp.status_code == 403:
            raise Denied(f"token endpoint denied {scope}", status=403, step="token", code=_error_code(resp))
        if resp.status_code != 200:
            raise self._error(resp, "token", step="token")
        try:
            body = resp.json()
            value = body.get("token") or body.get("access_token")
            expires_in = float(body.get("expires_in") or 60)
        except (ValueError, AttributeError, TypeError):
            raise ProtocolError("token endpoint returned malformed JSON", status=200, step="token") from None
        if not value:
            raise ProtocolError("token endpoint returned no token", status=200, step="token")
        self._tokens[scope] = _Token(str(value), time.monotonic() + max(1.0, expires_in - 10))

    def _check_realm(self, realm: httpx.URL) -> None:
        """https unless the registry is http; private realms only on the registry's own host."""
        if realm.scheme not in ("https", "http") or (realm.scheme == "http" and self.scheme == "https"):
            raise ProtocolError(f"refusing token realm scheme {realm.scheme!r} for an {self.scheme} registry",
                                step="token")
        registry_host = httpx.URL(self.base_url).host
        if _is_private_host(realm.host) and realm.host != registry_host:
            raise ProtocolError(f"refusing private token realm host {realm.host!r}", step="token")

    async def _send(self, method: str, url: str, *, headers: dict[str, str] | None = None,
                    auth: str | None = None, follow_redirects: bool = False,
                    auth_origin: httpx.URL | None = None, max_body: int = MAX_REPLY_BYTES) -> httpx.Response:
        """One logical request: bounded retries on 429 (honouring Retry-After), 5xx and network errors.
        A reply past ``max_body`` bytes, or a credential bound elsewhere, is a ProtocolError (not retried)."""
        last_retry_after: float | None = None
        for attempt in range(self.max_retries + 1):
            try:
                resp = await self._send_once(method, url, headers, auth, follow_redirects, auth_origin, max_body)
            except (http_guard.ResponseTooLarge, http_guard.CredentialRefused) as e:
                raise ProtocolError(str(e), step="token" if auth_origin is not None else "registry") from None
            except httpx.TransportError as e:
                if attempt >= self.max_retries:
                    raise RegistryUnavailable(f"{method} {_safe(url)}: {type(e).__name__}") from None
                await self._sleep(min(0.2 * 2**attempt, self.max_retry_after_s))
                continue
            if resp.status_code == 429:
                last_retry_after = parse_retry_after(resp.headers.get("retry-after"))
                if attempt >= self.max_retries:
                    raise RateLimited(f"{method} {_safe(url)}: rate limited", status=429,
                                      retry_after=last_retry_after, code=_error_code(resp))
                await self._sleep(min(last_retry_after if last_retry_after is not None else 1.0,
                                      self.max_retry_after_s))
                continue
            if resp.status_code in (500, 502, 503, 504):
                if attempt >= self.max_retries:
                    return resp
                delay = parse_retry_after(resp.headers.get("retry-after"))
                await self._sleep(min(delay if delay is not None else 0.2 * 2**attempt, self.max_retry_after_s))
                continue
            return resp
        raise AssertionError("unreachable")

    async def _send_once(self, method: str, url: str, headers: dict[str, str] | None, auth: str | None,
                         follow_redirects: bool, auth_origin: httpx.URL | None,
                         max_body: int = MAX_REPLY_BYTES) -> httpx.Response:
        """Follow redirects ourselves so Authorization only goes to its own origin (registry or realm)."""
        origin = auth_origin or httpx.URL(self.base_url)
        target = httpx.URL(url)
        for _ in range(6):
            h = dict(headers or {})
            same_origin = (target.scheme, target.host, target.port) == (origin.scheme, origin.host, origin.port)
            if auth and same_origin:
                h["Authorization"] = auth
            resp = await self._http.request(method, target, headers=h, extensions={http_guard.BODY_CAP: max_body})
            if not (follow_redirects and resp.is_redirect and "location" in resp.headers):
                return resp
            await resp.aread()
            target = target.join(resp.headers["location"])
        raise ProtocolError(f"too many redirects for {_safe(url)}")

    def _error(self, resp: httpx.Response, what: str, step: AuthStep = "registry") -> RegistryError:
        code = _error_code(resp)
        status = resp.status_code
        msg = f"{what}: HTTP {status}" + (f" {code}" if code else "")
        if status == 404:
            return NotFound(msg, status=status, step=step, code=code)
        if status == 403:
            return Denied(msg, status=status, step=step, code=code)
        if status == 401:
            return Unauthorized(msg, status=status, step=step, code=code)
        if status == 429:
            return RateLimited(msg, status=status, step=step, code=code,
                               retry_after=parse_retry_after(resp.headers.get("retry-after")))
        if status >= 500:
            return RegistryUnavailable(msg, status=status, step=step, code=code)
        return ProtocolError(msg, status=status, step=step, code=code)


def _safe(url: str) -> str:
    """A URL for messages: no query (signed blob URLs carry credentials in it), no userinfo."""
    u = httpx.URL(url)
    return str(u.copy_with(query=None, fragment=None, username=None, password=None))


def split_image_repository(image_repository: str) -> tuple[str, str]:
    """``ghcr.io/org/name`` → (``ghcr.io``, ``org/name``); the first component must be a host."""
    host, sep, repo = image_repository.partition("/")
    if not sep or not repo or not ("." in host or ":" in host or host == "localhost"):
        raise ValueError(f"image repository must start with a registry host: {image_repository!r}")
    return host, repo


def scheme_for(host: str, insecure_hosts: tuple[str, ...] | list[str] = ()) -> Literal["https", "http"]:
    return "http" if host in insecure_hosts else "https"
