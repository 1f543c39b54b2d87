"""A real local OCI registry (Debian ``docker-registry``, distribution 2.8) for the sandbox and tests.

Why real: digest, Accept and auth behaviour of a real registry is what the validator must survive.
Three modes: ``open`` (anonymous push/pull), ``htpasswd`` (Basic auth) and ``token`` (a ghcr-like
token server: the push user gets push+pull anywhere, anonymous callers get pull on public repos only
and a 401 ``UNAUTHORIZED`` for everything else, as ghcr does for private/internal/missing packages).
An optional in-process pass-through proxy can inject 429/503 replies for fault tests.
"""

from __future__ import annotations

import atexit
import base64
import datetime as dt
import http.client
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Literal

REGISTRY_BIN = "/usr/bin/docker-registry"
TOKEN_SERVICE = "sandbox-registry"
TOKEN_ISSUER = "sandbox-token-issuer"
_LISTENING = re.compile(r"listening on (127\.0\.0\.1:\d+)")

Mode = Literal["open", "htpasswd", "token"]


class _QuietHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes: with Nagle on, the body waits for the client's delayed ACK
    # (40 ms on Linux), which made every token-auth validation ~40 ms slower than against a real registry.
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        pass

    def _reply(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


def _serve_in_thread(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name=handler.__name__, daemon=True).start()
    return server


# --- token server ---------------------------------------------------------------------------------


class _TokenSigner:
    """ES256 key plus a self-signed cert; the cert is the registry's rootcertbundle and the JWT x5c."""

    def __init__(self, cert_path: Path) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        self._key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, TOKEN_ISSUER)])
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=30))
            .sign(self._key, hashes.SHA256())
        )
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        self._x5c = base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode()

    def sign(self, subject: str, access: list[dict[str, object]], ttl_s: int = 300) -> str:
        import jwt

        now = int(time.time())
        claims = {
            "iss": TOKEN_ISSUER,
            "sub": subject,
            "aud": TOKEN_SERVICE,
            "exp": now + ttl_s,
            "nbf": now - 5,
            "iat": now,
            "jti": secrets.token_hex(8),
            "access": access,
        }
        return jwt.encode(claims, self._key, algorithm="ES256", headers={"x5c": [self._x5c]})


class _TokenServer:
    """ghcr-like token endpoint ``/token`` and a visibility admin endpoint ``/admin/public``."""

    def __init__(self, signer: _TokenSigner, push_user: str, push_token: str, public: Iterable[str]) -> None:
        self.signer = signer
        self.push_user = push_user
        self._push_token = push_token
        self._public = set(public)
        self._lock = threading.Lock()
        self.server = _serve_in_thread(self._handler())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def set_public(self, repo: str, public: bool) -> None:
        with self._lock:
            (self._public.add if public else self._public.discard)(repo)

    def is_public(self, repo: str) -> bool:
        with self._lock:
            return repo in self._public

    def _authenticated(self, header: str | None) -> bool | None:
        """True for the push user, False for bad Basic creds, None when anonymous."""
        if not header:
            return None
        if not header.lower().startswith("basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:]).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        ok_user = secrets.compare_digest(user, self.push_user)
        return ok_user and secrets.compare_digest(password, self._push_token)

    def issue(self, auth_header: str | None, scopes: list[str]) -> tuple[int, dict[str, object]]:
        who = self._authenticated(auth_header)
        if who is False:
            return 401, _unauthorized("invalid username or token")
        access: list[dict[str, object]] = []
        for scope in scopes:
            parts = scope.split(":")
            if len(parts) != 3 or parts[0] != "repository":
                continue
            _, repo, actions = parts
            wanted = [a for a in actions.split(",") if a]
            if who:
                granted = [a for a in wanted if a in ("pull", "push", "delete", "*")]
            elif self.is_public(repo):
                granted = [a for a in wanted if a == "pull"]
            else:
                return 401, _unauthorized("authentication required")
            access.append({"type": "repository", "name": repo, "actions": granted})
        token = self.signer.sign(self.push_user if who else "", access)
        return 200, {"token": token, "access_token": token, "expires_in": 300,
                     "issued_at": dt.datetime.now(dt.UTC).isoformat()}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        outer = self

        class TokenHandler(_QuietHandler):
            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                if url.path != "/token":
                    self._reply(404, b"not found")
                    return
                scopes = urllib.parse.parse_qs(url.query).get("scope", [])
                status, body = outer.issue(self.headers.get("Authorization"), scopes)
                self._reply(status, json.dumps(body).encode(), {"Content-Type": "application/json"})

            def do_POST(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                q = urllib.parse.parse_qs(url.query)
                if url.path != "/admin/public" or "repo" not in q:
                    self._reply(404, b"not found")
                    return
                outer.set_public(q["repo"][0], q.get("public", ["1"])[0] in ("1", "true"))
                self._reply(204, b"")

        return TokenHandler


def _unauthorized(message: str) -> dict[str, object]:
    return {"errors": [{"code": "UNAUTHORIZED", "message": message, "detail": None}]}


# --- fault-injecting pass-through proxy -----------------------------------------------------------

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
               "proxy-authorization", "proxy-authenticate"}


class _FaultProxy:
    """Forwards every request to the registry unless a fault is queued; control at ``/__fault__``."""

    def __init__(self, upstream_host: str) -> None:
        self.upstream_host = upstream_host
        self._lock = threading.Lock()
        self._fault: tuple[int, int, float | None] | None = None  # status, remaining, retry_after
        self.faults_served = 0
        self.server = _serve_in_thread(self._handler())

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    def inject(self, status: int, count: int, retry_after: float | None = None) -> None:
        with self._lock:
            self._fault = (status, count, retry_after) if count > 0 else None

    def take_fault(self) -> tuple[int, float | None] | None:
        with self._lock:
            if not self._fault:
                return None
            status, remaining, retry_after = self._fault
            self._fault = (status, remaining - 1, retry_after) if remaining > 1 else None
            self.faults_served += 1
            return status, retry_after

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        outer = self

        class ProxyHandler(_QuietHandler):
            def _control(self) -> None:
                q = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
                ra = q.get("retry_after", [None])[0]
                outer.inject(int(q["status"][0]), int(q.get("count", ["1"])[0]),
                             float(ra) if ra is not None else None)
                self._reply(204, b"")

            def _forward(self) -> None:
                if self.path.startswith("/__fault__"):
                    self._control()
                    return
                fault = outer.take_fault()
                if fault:
                    status, retry_after = fault
                    code = "TOOMANYREQUESTS" if status == 429 else "UNAVAILABLE"
                    headers = {"Content-Type": "application/json"}
                    if retry_after is not None:
                        headers["Retry-After"] = f"{retry_after:g}"
                    body = json.dumps({"errors": [{"code": code, "message": "injected fault"}]}).encode()
                    self._reply(status, body, headers)
                    return
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                conn = http.client.HTTPConnection(outer.upstream_host, timeout=60)
                try:
                    # header by header: clients such as skopeo repeat Accept, a dict would keep one
                    conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                    for k, v in self.headers.items():
                        if k.lower() not in _HOP_BY_HOP and k.lower() != "content-length":
                            conn.putheader(k, v)
                    if body is not None:
                        conn.putheader("Content-Length", str(len(body)))
                    conn.endheaders(body)
                    resp = conn.getresponse()
                    data = resp.read()
                    self.send_response(resp.status)
                    for k, v in resp.getheaders():
                        if k.lower() not in _HOP_BY_HOP and k.lower() != "content-length":
                            self.send_header(k, v)
                    length_header = resp.getheader("Content-Length")
                    send_len = length_header if self.command == "HEAD" and length_header else str(len(data))
                    self.send_header("Content-Length", send_len)
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(data)
                finally:
                    conn.close()

            do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

        return ProxyHandler


# --- the registry process and its handle ----------------------------------------------------------


class RegistryHandle:
    """A running local registry. ``stop()`` is idempotent and registered with atexit."""

    def __init__(self, *, proc: subprocess.Popen[bytes], registry_host: str, mode: Mode, state_dir: Path,
                 token_server: _TokenServer | None, proxy: _FaultProxy | None,
                 push_user: str | None, push_token: str | None) -> None:
        self._proc = proc
        self.mode: Mode = mode
        self.state_dir = state_dir
        self.registry_host = registry_host  # the registry itself, bypassing any fault proxy
        self._token_server = token_server
        self._proxy = proxy
        self.push_user = push_user
        self._push_token = push_token
        self._stopped = False
        atexit.register(self.stop)

    def __repr__(self) -> str:
        return f"RegistryHandle(mode={self.mode!r}, url={self.url!r}, pid={self.pid})"

    @property
    def host(self) -> str:
        """host:port clients should use (the fault proxy when one is enabled)."""
        return self._proxy.host if self._proxy else self.registry_host

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def push_token(self) -> str | None:
        """Secret of the push user (htpasswd password or token-server credential); never log it."""
        return self._push_token

    @property
    def credentials(self) -> tuple[str, str] | None:
        if self.push_user and self._push_token:
            return self.push_user, self._push_token
        return None

    @property
    def token_url(self) -> str | None:
        return f"{self._token_server.url}/token" if self._token_server else None

    @property
    def admin_url(self) -> str | None:
        """POST ``<admin_url>?repo=<name>&public=1|0`` toggles visibility from another process."""
        return f"{self._token_server.url}/admin/public" if self._token_server else None

    @property
    def fault_url(self) -> str | None:
        """POST ``<fault_url>?status=429&count=2&retry_after=1`` queues faults from another process."""
        return f"http://{self._proxy.host}/__fault__" if self._proxy else None

    @property
    def faults_served(self) -> int:
        return self._proxy.faults_served if self._proxy else 0

    def set_public(self, repo: str, public: bool) -> None:
        if not self._token_server:
            raise ValueError(f"visibility applies to token mode only (this registry is {self.mode})")
        self._token_server.set_public(repo, public)

    def is_public(self, repo: str) -> bool:
        return bool(self._token_server and self._token_server.is_public(repo))

    def inject(self, status: int, count: int, retry_after: float | None = None) -> None:
        """Make the next ``count`` registry requests answer ``status`` (e.g. 429 with Retry-After, 503)."""
        if not self._proxy:
            raise ValueError("start_registry(..., fault_proxy=True) to inject faults")
        self._proxy.inject(status, count, retry_after)

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        for server in (self._proxy and self._proxy.server, self._token_server and self._token_server.server):
            if server:
                server.shutdown()
                server.server_close()
        _kill_group(self._proc)

    def __enter__(self) -> RegistryHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=5)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)


def _htpasswd_line(user: str, password: str) -> str:
    import bcrypt

    return f"{user}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=5)).decode()}\n"


def start_registry(state_dir: Path, mode: Mode = "open", public_repos: Iterable[str] = (), *,
                   fault_proxy: bool = False, push_user: str = "sandbox-pusher",
                   startup_timeout_s: float = 15.0) -> RegistryHandle:
    """Start ``docker-registry serve`` on 127.0.0.1 with a run-time port; storage under ``state_dir``."""
    binary = shutil.which("docker-registry") or REGISTRY_BIN
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    config: dict[str, object] = {
        "version": 0.1,
        "log": {"level": "info", "formatter": "text", "accesslog": {"disabled": True}},
        "storage": {"filesystem": {"rootdirectory": str(state_dir / "data")}, "delete": {"enabled": True},
                    "maintenance": {"uploadpurging": {"enabled": False}}},
        "http": {"addr": "127.0.0.1:0", "secret": secrets.token_hex(16)},
    }
    token_server = None
    push_token = None
    if mode == "htpasswd":
        push_token = secrets.token_urlsafe(24)
        htpasswd = state_dir / "htpasswd"
        htpasswd.write_text(_htpasswd_line(push_user, push_token))
        htpasswd.chmod(0o600)
        config["auth"] = {"htpasswd": {"realm": "sandbox", "path": str(htpasswd)}}
    elif mode == "token":
        # '+' and '/' in it: its URL-encoded and URL-safe base64 forms differ from the raw value and from
        # standard base64, so the sentinel tests cover every encoding with distinct strings.
        push_token = f"{secrets.token_urlsafe(18)}+/{secrets.token_urlsafe(9)}"
        cert = state_dir / "token-signer.pem"
        token_server = _TokenServer(_TokenSigner(cert), push_user, push_token, public_repos)
        config["auth"] = {"token": {"realm": f"{token_server.url}/token", "service": TOKEN_SERVICE,
                                    "issuer": TOKEN_ISSUER, "rootcertbundle": str(cert)}}
    elif mode != "open":
        raise ValueError(f"unknown registry mode {mode!r}")
    cfg_path = state_dir / "config.yml"
    cfg_path.write_text(json.dumps(config, indent=2))  # JSON is valid YAML
    log_path = state_dir / "registry.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([binary, "serve", str(cfg_path)], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        registry_host = _wait_listening(proc, log_path, startup_timeout_s)
    except BaseException:
        _kill_group(proc)
        if token_server:
            token_server.server.shutdown()
            token_server.server.server_close()
        raise
    proxy = _FaultProxy(registry_host) if fault_proxy else None
    return RegistryHandle(proc=proc, registry_host=registry_host, mode=mode, state_dir=state_dir,
                          token_server=token_server, proxy=proxy,
                          push_user=push_user if push_token else None, push_token=push_token)


def _wait_listening(proc: subprocess.Popen[bytes], log_path: Path, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = log_path.read_text(errors="replace")
        if m := _LISTENING.search(text):
            return m.group(1)
        if proc.poll() is not None:
            raise RuntimeError(f"docker-registry exited with {proc.returncode}: {text[-2000:]}")
        time.sleep(0.02)
    raise RuntimeError(f"docker-registry did not report 'listening on' within {timeout_s}s (log {log_path})")
