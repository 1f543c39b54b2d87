"""The reverse proxy the benches put in front of the Iris controller to count what a client sends on the wire.

Why one place: bench/end_phase.py and bench/monitoring.py both forward every request to the controller and
its reply back unchanged (hop-by-hop and length headers aside); they differ only in what they record about
a request and its reply, so each subclasses ``RelayProxy`` and overrides ``seen`` / ``answered``.
The standard library's threaded ``http.server`` and one shared ``httpx.Client``: what both benches used.
"""

from __future__ import annotations

import http.server
import threading
import time

import httpx

_REQUEST_HEADERS_DROPPED = ("host", "content-length")
_REPLY_HEADERS_DROPPED = ("content-length", "transfer-encoding", "connection", "content-encoding")


class RelayProxy:
    """A proxy on 127.0.0.1 (``url``; served by a daemon thread) relaying the ``methods`` to ``upstream``.

    ``seen(t0, rpc, body)`` is called as a request arrives (``t0``: ``time.time()``; ``rpc``: the last path
    segment, the Connect RPC method), ``answered(t0, t1, rpc, reply)`` once the controller replied (``t1``);
    both run on the server's request threads, so an override guards what it shares."""

    def __init__(self, upstream: str, methods: tuple[str, ...] = ("POST",)):
        self.upstream = upstream.rstrip("/")
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            client = httpx.Client(timeout=60)

            def log_message(self, *a):  # quiet
                pass

            def _forward(self, method: str) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                t0, rpc = time.time(), self.path.rsplit("/", 1)[-1]
                outer.seen(t0, rpc, body)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _REQUEST_HEADERS_DROPPED}
                r = self.client.request(method, outer.upstream + self.path, content=body, headers=headers)
                outer.answered(t0, time.time(), rpc, r)
                self.send_response(r.status_code)
                for k, v in r.headers.items():
                    if k.lower() not in _REPLY_HEADERS_DROPPED:
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(r.content)))
                self.end_headers()
                self.wfile.write(r.content)

        for method in methods:  # only these: another method is answered 501 by http.server, as before
            setattr(Handler, f"do_{method}", lambda self, m=method: self._forward(m))
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def seen(self, t0: float, rpc: str, body: bytes) -> None:
        """A request arrived (before it is forwarded)."""

    def answered(self, t0: float, t1: float, rpc: str, reply: httpx.Response) -> None:
        """The controller answered the request that arrived at ``t0``."""

    def stop(self) -> None:
        self.server.shutdown()
