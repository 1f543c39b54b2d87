"""A stdlib HTTP server served from a daemon thread: the worker's health probes and its GitHub webhook
receiver. Why stdlib ``http.server``: both answer a few small requests and must not share the worker's
event loop (a probe has to answer while the loop is busy); one place starts, reports and stops them."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class BackgroundHTTPServer:
    """Serves ``handler`` on ``(host, port)`` from a daemon thread until ``close()``."""

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], name: str):
        self._server = ThreadingHTTPServer(address, handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name=name, daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
