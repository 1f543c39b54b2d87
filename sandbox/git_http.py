"""A git smart-HTTP remote with Basic auth, served by real ``git http-backend`` (CGI).

Why: the sandbox's git remotes are ``file://`` paths, which can never refuse a credential. This
serves the same bare repositories over HTTP the way a git host does: a wrong token gets 401, a token
without write access gets 403 on push, a repository that does not exist gets 404 — so the error
boundary is tested against git's real messages for each. Only ``http-backend`` speaks git here; this
module checks the credential and relays CGI.

As on GitHub: a public repository (``anonymous_read``) is read without a credential, and every push
needs one (anonymous: 401 with ``WWW-Authenticate: Basic``, which is when git asks its credential
helper). ``verify`` checks a credential some other way (e.g. a GitHub App installation token, asked of
the GitHub stand-in). ``authorizations`` keeps every ``Authorization`` header presented, for tests that
prove a credential never reached this host.
"""

from __future__ import annotations

import base64
import os
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

HTTP_BACKEND = "/usr/lib/git-core/git-http-backend"


@dataclass
class GitHttpRemote:
    """Serves every bare repository under ``root`` at ``http://127.0.0.1:<port>/<name>.git``."""

    root: Path
    users: dict[str, str]  # user -> token that may read
    writers: set[str] = field(default_factory=set)  # users who may also push
    anonymous_read: bool = False  # a public repository: fetches need no credential (pushes always do)
    verify: Callable[[str, str], str | None] | None = None  # (user, token) -> who, else refused
    authorizations: list[str] = field(default_factory=list)  # every Authorization header presented
    server: ThreadingHTTPServer | None = None

    def url(self, name: str, user: str | None = None, token: str | None = None) -> str:
        assert self.server is not None
        cred = f"{user}:{token}@" if user else ""
        return f"http://{cred}127.0.0.1:{self.server.server_address[1]}/{name}"

    def start(self) -> GitHttpRemote:
        remote = self

        class Handler(BaseHTTPRequestHandler):
            disable_nagle_algorithm = True  # headers and body in two writes: no 40 ms delayed-ACK stall

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                self._serve()

            def do_POST(self) -> None:
                self._serve()

            def _serve(self) -> None:
                if "Authorization" in self.headers:
                    remote.authorizations.append(self.headers["Authorization"])
                parts = urlsplit(self.path)
                push = "git-receive-pack" in (parts.path + parts.query)
                user = self._user()
                if user is None and not self.headers.get("Authorization") and remote.anonymous_read and not push:
                    user = "anonymous"
                if user is None:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="git"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if push and user not in remote.writers:
                    self.send_response(403)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = self._body()
                env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GIT_PROJECT_ROOT": str(remote.root),
                       "GIT_HTTP_EXPORT_ALL": "1", "PATH_INFO": parts.path, "QUERY_STRING": parts.query,
                       "REQUEST_METHOD": self.command, "CONTENT_TYPE": self.headers.get("Content-Type", ""),
                       "CONTENT_LENGTH": str(len(body)), "REMOTE_USER": user, "REMOTE_ADDR": "127.0.0.1",
                       "GIT_HTTP_MAX_REQUEST_BUFFER": "100M"}
                if self.headers.get("Git-Protocol"):
                    env["GIT_PROTOCOL"] = self.headers["Git-Protocol"]
                if self.headers.get("Content-Encoding"):  # git gzips large requests; http-backend inflates
                    env["HTTP_CONTENT_ENCODING"] = self.headers["Content-Encoding"]
                out = subprocess.run([HTTP_BACKEND], input=body, env=env, capture_output=True, timeout=120).stdout
                head, _, payload = out.partition(b"\r\n\r\n")
                status, headers = 200, []
                for line in head.decode("latin-1").split("\r\n"):
                    name, _, value = line.partition(":")
                    if name.lower() == "status":
                        status = int(value.strip().split()[0])
                    elif name:
                        headers.append((name, value.strip()))
                self.send_response(status)
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def _body(self) -> bytes:
                """The request body: ``Content-Length`` bytes, or a chunked body (git sends a push larger
                than its ``http.postBuffer``, 1 MiB, in chunks), read chunk by chunk to the last."""
                if "chunked" not in self.headers.get("Transfer-Encoding", "").lower():
                    return self.rfile.read(int(self.headers.get("Content-Length") or 0))
                chunks = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                            pass
                        return b"".join(chunks)
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()  # the CRLF after each chunk

            def _user(self) -> str | None:
                auth = self.headers.get("Authorization", "")
                if not auth.startswith("Basic "):
                    return None
                user, _, token = base64.b64decode(auth[6:]).decode(errors="replace").partition(":")
                if remote.verify is not None:
                    return remote.verify(user, token)
                return user if token and remote.users.get(user) == token else None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
