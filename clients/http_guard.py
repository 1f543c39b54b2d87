"""Every outgoing HTTP request of the service passes here: credentials go only to their own host over TLS,
and no reply body is read past a cap.

Why httpx event hooks: they run for every request the client actually sends, whichever transport or proxy
mount sends it, including each hop of a followed redirect and each request of an auth flow, so one check
here holds for every client (Iris, registry, GitHub, token minting) instead of one per call site.

- Credential destination (``domain.credential_hosts``): a request carrying ``Authorization``,
  ``Proxy-Authorization``, a cookie or userinfo in its URL goes only to the hosts configured for that
  credential, and never over plain http to a host that is not loopback; anything else raises
  ``CredentialRefused`` before a byte is sent. httpx itself drops ``Authorization`` when it follows a
  redirect to another origin, and this service's clients never follow one with a credential attached.
- Bounded bodies: the reply stream is wrapped so that reading past ``max_body_bytes`` (the client's
  default, or ``extensions={BODY_CAP: n}`` on one request) raises ``ResponseTooLarge`` naming the URL and
  the cap, having read at most the cap. Replies are requested uncompressed (``Accept-Encoding:
  identity``), so the cap bounds what is held in memory and not only what crossed the wire.
"""

from __future__ import annotations

import functools
import ssl
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

import httpx

from domain.credential_hosts import destination_problem

BODY_CAP = "gpu_rl_builder.max_body_bytes"  # per-request cap (request extension)
_CREDENTIAL_HEADERS = ("authorization", "proxy-authorization", "cookie")


class CredentialRefused(Exception):
    """A request would carry a credential to a host not configured for it, or in cleartext."""


class ResponseTooLarge(Exception):
    """A reply body went past its cap (only the cap was read)."""

    def __init__(self, url: str, cap: int):
        self.url, self.cap = url, cap
        super().__init__(f"the reply from {url} is larger than {cap} bytes (the cap for this request); "
                         "refused, not read further")


def safe_url(url: httpx.URL) -> str:
    """A URL for messages: no userinfo, query or fragment (a signed URL carries a credential there)."""
    return str(url.copy_with(username=None, password=None, query=None, fragment=None))


def carries_credential(request: httpx.Request) -> bool:
    return any(h in request.headers for h in _CREDENTIAL_HEADERS) or bool(request.url.userinfo)


def resolve_host(host: str) -> list[str]:
    """The addresses ``host`` resolves to on this machine (``socket.getaddrinfo``; ``OSError`` if none):
    the resolver ``domain.credential_hosts.is_loopback_host`` asks about a ``*.localhost`` name."""
    import socket

    return [info[4][0] for info in socket.getaddrinfo(host, None)]


def check_request(request: httpx.Request, allowed_hosts: Iterable[str], credential: str) -> None:
    """Raise ``CredentialRefused`` when ``request`` carries a credential where it must not go."""
    if not carries_credential(request):
        return
    problem = destination_problem(str(request.url), allowed_hosts, credential=credential, resolve=resolve_host)
    if problem:
        raise CredentialRefused(f"refusing {request.method} {safe_url(request.url)}: {problem}")


class _CappedAsync(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, url: str, cap: int):
        self._inner, self._url, self._cap = inner, url, cap

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in self._inner:
            seen += len(chunk)
            if seen > self._cap:
                raise ResponseTooLarge(self._url, self._cap)
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class _CappedSync(httpx.SyncByteStream):
    def __init__(self, inner: httpx.SyncByteStream, url: str, cap: int):
        self._inner, self._url, self._cap = inner, url, cap

    def __iter__(self) -> Iterator[bytes]:
        seen = 0
        for chunk in self._inner:
            seen += len(chunk)
            if seen > self._cap:
                raise ResponseTooLarge(self._url, self._cap)
            yield chunk

    def close(self) -> None:
        self._inner.close()


def _cap_of(response: httpx.Response, default: int) -> int:
    return int(response.request.extensions.get(BODY_CAP, default))


@functools.cache
def shared_ssl_context() -> ssl.SSLContext:
    """httpx's own default verification context (certifi's CAs, or ``SSL_CERT_FILE``/``SSL_CERT_DIR`` as
    they were when first asked), built once per process and shared by every client.

    Why: httpx builds a new context for every client, and loading the CA bundle is CPU work on the event
    loop (tens of ms idle, hundreds under load). Activities open a client per call (``iris_client``), so
    at 200 targets registering and acting at once this was 39% of the worker's CPU samples and delayed
    every workflow task behind it (bench/monitoring.py, docs/benchmarks.md). An ``SSLContext`` is made to
    be shared; its settings are never changed after this."""
    return httpx.create_ssl_context()


def _kwargs(allowed_hosts: Iterable[str], credential: str, max_body_bytes: int, kw: dict[str, Any],
            *, is_async: bool) -> dict[str, Any]:
    hosts = tuple(h.lower() for h in allowed_hosts if h)
    if "verify" not in kw and kw.get("trust_env", True):
        kw = {**kw, "verify": shared_ssl_context()}
    headers = httpx.Headers(kw.pop("headers", None))
    headers.setdefault("Accept-Encoding", "identity")
    if is_async:
        async def on_request(request: httpx.Request) -> None:
            check_request(request, hosts, credential)

        async def on_response(response: httpx.Response) -> None:
            response.stream = _CappedAsync(response.stream, safe_url(response.request.url),  # type: ignore[arg-type]
                                           _cap_of(response, max_body_bytes))
    else:
        def on_request(request: httpx.Request) -> None:  # type: ignore[misc]
            check_request(request, hosts, credential)

        def on_response(response: httpx.Response) -> None:  # type: ignore[misc]
            response.stream = _CappedSync(response.stream, safe_url(response.request.url),  # type: ignore[arg-type]
                                          _cap_of(response, max_body_bytes))
    return {**kw, "headers": headers, "event_hooks": {"request": [on_request], "response": [on_response]}}


def async_client(*, allowed_hosts: Iterable[str], credential: str, max_body_bytes: int,
                 **kw: Any) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` whose credentials (``credential``: the config key, for errors) go only to
    ``allowed_hosts`` over TLS (loopback excepted) and whose reply bodies stop at ``max_body_bytes``."""
    return httpx.AsyncClient(**_kwargs(allowed_hosts, credential, max_body_bytes, kw, is_async=True))


def sync_client(*, allowed_hosts: Iterable[str], credential: str, max_body_bytes: int, **kw: Any) -> httpx.Client:
    """``async_client`` for synchronous callers (token minting, ``GET /user``)."""
    return httpx.Client(**_kwargs(allowed_hosts, credential, max_body_bytes, kw, is_async=False))
