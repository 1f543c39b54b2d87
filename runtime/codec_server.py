"""The codec server the Temporal UI calls to show payloads decoded, to operators only.

Temporal's codec-server protocol: ``POST /decode`` and ``POST /encode`` with ``{"payloads": [...]}`` (the
JSON form of ``temporal.api.common.v1.Payloads``), answered in the same form, run through the worker's own
codec (runtime/payload_codec.py): decode decrypts (the payloads were redacted before they were encrypted,
so nothing decodes to a secret), encode redacts and encrypts. The UI calls it from the browser, so CORS
allows the configured UI origins (Starlette's ``CORSMiddleware``: the preflight and the headers it needs).

Who may decode: a request must carry ``Authorization: Bearer <token>`` with one of
``temporal.codec.server.tokens``, or, with ``github_operators``, a GitHub access token (what the UI
passes with ``codec.passAccessToken`` under GitHub sign-in) whose login is a configured operator
(``GET /user``, cached a minute by the token's digest): listed in ``operators.logins`` or, when the
configuration names ``operators.teams``, an active member of one of them, decided by the same check that
authorizes ``approve-merge`` (``activities.merge_gate.verify_operator``, team membership read through the
GitHub API; cached a minute by login). Anything else is 401 (no or unknown token) or 403 (a login that is
not an operator, another namespace), or 503 when GitHub cannot say, with no payload read.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from collections.abc import Awaitable, Callable

from google.protobuf.json_format import MessageToDict, Parse, ParseError
from starlette.middleware.cors import CORSMiddleware
from temporalio.api.common.v1 import Payloads

from domain.config import OperatorSettings
from domain.redact import redact
from runtime.asgi_thread import ASGIThread, BodyTooLarge, read_body
from runtime.logging import get_logger
from runtime.payload_codec import CodecError, RedactingCodec

READ_TIMEOUT_S = 30.0
MAX_HANDLERS = 16
LOGIN_CACHE_S = 60.0

LoginOf = Callable[[str], Awaitable[str | None]]
# How a login is an operator ("config:operators.logins", "team org/slug"), or None (raises when unreadable).
OperatorOf = Callable[[str], Awaitable[str | None]]


def operator_checker(operators: OperatorSettings, github: Callable[[], object | None]) -> OperatorOf:
    """The approval path's check (``verify_operator``: operators.logins, then operators.teams through the
    GitHub API, strict), with a fresh client from ``github()`` per check (the codec server's thread has its
    own event loop; a verdict is cached by the app, so this runs about once a minute per login)."""

    async def operator_of(login: str) -> str | None:
        from activities.merge_gate import verify_operator

        gh = github()
        try:
            return await verify_operator(gh, operators, login)
        finally:
            if gh is not None:
                await gh.aclose()

    return operator_of


def github_login_reader(api_url: str) -> LoginOf:
    """``GET <api_url>/user`` with the token: its login, or None when GitHub refuses the token."""
    import httpx

    async def login_of(token: str) -> str | None:
        async with httpx.AsyncClient(timeout=10) as http:
            resp = await http.get(f"{api_url.rstrip('/')}/user",
                                  headers={"Authorization": f"Bearer {token}", "Accept": "application/vnd.github+json"})
        if resp.status_code != 200:
            return None
        login = resp.json().get("login")
        return login if isinstance(login, str) else None

    return login_of


class CodecApp:
    """The ASGI app: auth first, then a bounded body, then the codec."""

    def __init__(self, codec: RedactingCodec, namespace: str, tokens: list[str], *,
                 operators: set[str] | OperatorSettings | None = None, login_of: LoginOf | None = None,
                 operator_of: OperatorOf | None = None, max_body_bytes: int = 4 * 1024 * 1024):
        """``operators``: logins (a set) or the configuration's ``[operators]``; ``operator_of`` (needed when
        it names teams: ``operator_checker``) decides a login that is not listed by name."""
        self.codec = codec
        self.namespace = namespace
        self._tokens = [t.encode() for t in tokens if t]
        if not isinstance(operators, OperatorSettings):
            operators = OperatorSettings(logins=sorted(operators or ()))
        self._operators = operators
        self._operator_of = operator_of
        self._login_of = login_of
        self._logins: dict[str, tuple[float, str | None]] = {}
        self._verdicts: dict[str, tuple[float, str | None]] = {}  # login -> (when, how it is an operator)
        self._slots = asyncio.Semaphore(MAX_HANDLERS)
        self.max_body_bytes = max_body_bytes
        self.log = get_logger("codec-server")

    async def _authorized(self, headers: dict[bytes, bytes]) -> tuple[int, str] | None:
        auth = headers.get(b"authorization", b"").decode("latin-1")
        scheme, _, token = auth.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return 401, "an operator's bearer token is required"
        if any(hmac.compare_digest(token.encode(), t) for t in self._tokens):
            return None
        if self._login_of is None:
            return 401, "unknown token"
        key = hashlib.sha256(token.encode()).hexdigest()
        cached = self._logins.get(key)
        if cached is None or time.monotonic() - cached[0] > LOGIN_CACHE_S:
            try:
                login = await self._login_of(token)
            except Exception as e:  # noqa: BLE001 - GitHub unreachable: nobody is let in
                return 503, f"cannot check the token with GitHub: {type(e).__name__}"
            cached = (time.monotonic(), login)
            self._logins[key] = cached
        login = cached[1]
        if login is None:
            return 401, "unknown token"
        if self._operators.lists(login):
            return None
        if self._operators.teams:
            if self._operator_of is None:  # a wiring error: refuse, never guess
                return 503, "operators.teams is configured but the codec server cannot read team membership"
            verdict = self._verdicts.get(login.lower())
            if verdict is None or time.monotonic() - verdict[0] > LOGIN_CACHE_S:
                try:
                    verdict = (time.monotonic(), await self._operator_of(login))
                except Exception as e:  # noqa: BLE001 - membership unreadable: nobody is let in by a team
                    return 503, f"cannot read {login}'s membership of operators.teams: {redact(str(e))[:200]}"
                self._verdicts[login.lower()] = verdict
            if verdict[1] is not None:
                return None
        return 403, f"{login} is not an operator (operators.logins / operators.teams)"

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        path, method = scope["path"].rstrip("/"), scope["method"]
        headers = {k.lower(): v for k, v in scope["headers"]}
        if not path.endswith(("/decode", "/encode")):
            return await _answer(send, 404, {"message": "not found: POST /decode or /encode"})
        if method != "POST":
            return await _answer(send, 405, {"message": "POST only"})
        if refused := await self._authorized(headers):
            self.log.warning("codec request refused", status=refused[0], reason=refused[1], path=path)
            return await _answer(send, refused[0], {"message": refused[1]})
        namespace = headers.get(b"x-namespace", b"").decode("latin-1")
        if namespace and namespace != self.namespace:
            return await _answer(send, 403, {"message": f"namespace {namespace[:80]!r} is not {self.namespace}"})
        if self._slots.locked():
            return await _answer(send, 503, {"message": "busy"})
        async with self._slots:
            try:
                body = await read_body(receive, self.max_body_bytes, READ_TIMEOUT_S)
            except BodyTooLarge as e:
                return await _answer(send, 413, {"message": str(e)})
            except (TimeoutError, ConnectionError):
                return await _answer(send, 408, {"message": f"body not received within {READ_TIMEOUT_S:g} s"})
            try:
                payloads = Parse(body, Payloads())
            except (ParseError, ValueError, UnicodeDecodeError) as e:
                return await _answer(send, 400, {"message": f"not a Payloads JSON document: {redact(str(e))[:200]}"})
            step = self.codec.decode_one if path.endswith("/decode") else self.codec.encode_one
            try:
                out = Payloads(payloads=[step(p) for p in payloads.payloads])
            except CodecError as e:
                return await _answer(send, 422, {"message": str(e)})
            return await _answer(send, 200, MessageToDict(out))


async def _answer(send, status: int, payload: dict) -> None:
    data = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


def asgi_app(app: CodecApp, cors_origins: list[str]):
    """``app`` behind CORS for the UI's origins (the browser's preflight and the headers the UI sends)."""
    return CORSMiddleware(app, allow_origins=cors_origins, allow_methods=["POST"], allow_credentials=True,
                          allow_headers=["Content-Type", "Authorization", "X-Namespace"])


class CodecServer:
    """The codec server on ``host:port`` from its own thread; ``close()`` stops it."""

    def __init__(self, app: CodecApp, host: str, port: int, cors_origins: list[str]):
        self.app = app
        self._http = ASGIThread(asgi_app(app, cors_origins), host, port, "codec-server")

    @property
    def port(self) -> int:
        return self._http.port

    def close(self) -> None:
        self._http.close()
