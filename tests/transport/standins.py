"""Small stdlib HTTP servers for the transport tests: one that answers a body that never ends, one that
records what it was sent (and may redirect elsewhere). Stand-ins for misbehaving or foreign hosts."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Server:
    """Serves ``respond(handler)`` for every request on 127.0.0.1; ``seen`` records (method, path,
    Authorization) of each request; ``sent`` counts body bytes written."""

    def __init__(self, respond, host: str = "127.0.0.1"):
        self.seen: list[tuple[str, str, str | None]] = []
        self.sent = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def _any(self) -> None:
                outer.seen.append((self.command, self.path, self.headers.get("Authorization")))
                if length := int(self.headers.get("Content-Length") or 0):
                    self.rfile.read(length)
                try:
                    respond(self, outer)
                except OSError:  # the client stopped reading: what a capped reader does
                    pass

            do_GET = do_POST = do_HEAD = _any

            def log_message(self, *_args) -> None:
                pass

        self._httpd = ThreadingHTTPServer((host, 0), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(10)


def endless(handler: BaseHTTPRequestHandler, server: Server, limit: int | None = None) -> None:
    """200 with a JSON-looking body and no length that never ends (until the client goes away), or that
    ends after ``limit`` bytes with valid JSON (so a reader without a cap gets a normal answer)."""
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.end_headers()
    handler.wfile.write(b'{"status": "ok", "login": "someone", "pad": "')
    chunk = b"x" * 65536
    while limit is None or server.sent < limit:
        handler.wfile.write(chunk)
        server.sent += len(chunk)
    handler.wfile.write(b'"}')


def long(limit: int):
    """``endless`` that ends after ``limit`` bytes: for a synchronous reader, which a bound cannot cancel."""
    return lambda handler, server: endless(handler, server, limit)


def ok_json(payload: dict):
    def respond(handler: BaseHTTPRequestHandler, server: Server) -> None:
        body = json.dumps(payload).encode()
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)
    return respond
