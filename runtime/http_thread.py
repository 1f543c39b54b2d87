"""A stdlib HTTP server served from a daemon thread: the worker's health probes and its GitHub webhook
receiver. Why stdlib ``http.server``: both answer a few small requests and must not share the worker's
event loop (a probe has to answer while the loop is busy); one place starts, reports and stops them.

Why the limits: ``ThreadingHTTPServer`` gives every connection a thread and waits on it forever, so 50 idle
connections were 50 more threads that never ended. Here every connection has a thread only within
``max_connections`` (one more is answered 503 and closed at once), a connection silent for
``idle_timeout_s`` is closed (the socket timeout: a keep-alive or a stalled read), and the request line
and headers, then the body, must each arrive within ``read_timeout_s`` in total (a watchdog thread shuts
the socket down at the deadline, so a client that trickles one byte at a time cannot hold a thread either).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

IDLE_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 30.0
MAX_CONNECTIONS = 32
_BUSY = b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"


class TimedRequestHandler(BaseHTTPRequestHandler):
    """A handler whose request line and headers (and, through ``read_body``, body) must arrive within the
    server's ``read_timeout_s``."""

    server: _Server

    def handle_one_request(self) -> None:
        self.server.arm(self.connection)
        try:
            super().handle_one_request()
        finally:
            self.server.disarm(self.connection)

    def parse_request(self) -> bool:
        ok = super().parse_request()
        self.server.disarm(self.connection)  # the headers are in: the handler's own time starts
        return ok

    def read_body(self, length: int) -> bytes:
        """``length`` bytes of body within ``read_timeout_s``; ConnectionAbortedError when cut short."""
        self.server.arm(self.connection)
        try:
            body = self.rfile.read(length)
        finally:
            self.server.disarm(self.connection)
        if len(body) != length:
            self.close_connection = True
            raise ConnectionAbortedError(f"body ended after {len(body)} of {length} bytes")
        return body


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], *, name: str,
                 idle_timeout_s: float, read_timeout_s: float, max_connections: int):
        self.name = name
        self.idle_timeout_s, self.read_timeout_s = idle_timeout_s, read_timeout_s
        self._slots = threading.BoundedSemaphore(max_connections)
        self._cond = threading.Condition()
        self._deadlines: dict[int, tuple[float, socket.socket]] = {}  # id(sock) -> (deadline, sock)
        self._heap: list[tuple[float, int, int]] = []  # (deadline, seq, id(sock)); stale entries skipped
        self._seq = itertools.count()
        self._closing = False
        self.accepted = 0  # connections accepted
        self.open = 0  # connections with a thread now
        self.peak = 0  # the most connections with a thread at once
        self.refused = 0  # connections answered 503 (over max_connections)
        self.cut = 0  # connections shut down at a read deadline
        # Made before binding: a taken port makes TCPServer.__init__ call server_close(), which joins it.
        self._watchdog = threading.Thread(target=self._watch, name=f"{name}-read-deadlines", daemon=True)
        super().__init__(address, handler)
        self._watchdog.start()

    # -- connection slots

    def process_request(self, request, client_address) -> None:  # type: ignore[override]
        self.accepted += 1  # the serving thread alone counts accepted, refused and peak
        if not self._slots.acquire(blocking=False):
            self.refused += 1
            with contextlib.suppress(OSError):
                request.setblocking(False)
                request.send(_BUSY)
            self.shutdown_request(request)
            return
        with self._cond:
            self.open += 1
            self.peak = max(self.peak, self.open)
        try:  # ThreadingMixIn.process_request, with the thread named after its server
            threading.Thread(target=self.process_request_thread, args=(request, client_address),
                             name=f"{self.name}-connection", daemon=True).start()
        except BaseException:
            self._release()
            self.shutdown_request(request)
            raise

    def _release(self) -> None:
        with self._cond:
            self.open -= 1
        self._slots.release()

    def process_request_thread(self, request, client_address) -> None:  # type: ignore[override]
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.disarm(request)
            self._release()

    def finish_request(self, request, client_address) -> None:  # type: ignore[override]
        request.settimeout(self.idle_timeout_s)  # every recv and send: a silent peer is dropped
        super().finish_request(request, client_address)

    def handle_error(self, request, client_address) -> None:  # type: ignore[override]
        """A peer that went away, timed out or was cut is not a server error (no traceback on stderr)."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)

    # -- read deadlines

    def arm(self, sock: socket.socket) -> None:
        deadline = time.monotonic() + self.read_timeout_s
        with self._cond:
            self._deadlines[id(sock)] = (deadline, sock)
            heapq.heappush(self._heap, (deadline, next(self._seq), id(sock)))
            self._cond.notify()

    def disarm(self, sock: socket.socket) -> None:
        with self._cond:
            self._deadlines.pop(id(sock), None)

    def _watch(self) -> None:
        with self._cond:
            while not self._closing:
                now = time.monotonic()
                while self._heap and self._heap[0][0] <= now:
                    deadline, _, key = heapq.heappop(self._heap)
                    armed = self._deadlines.get(key)
                    if armed is not None and armed[0] == deadline:
                        del self._deadlines[key]
                        self.cut += 1
                        with contextlib.suppress(OSError):
                            armed[1].shutdown(socket.SHUT_RDWR)  # the blocked read returns; the thread ends
                self._cond.wait(self._heap[0][0] - now if self._heap else None)

    def server_close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify()
        super().server_close()
        if self._watchdog.is_alive():  # not started when binding failed
            self._watchdog.join(timeout=10)


class BackgroundHTTPServer:
    """Serves ``handler`` on ``(host, port)`` from a daemon thread until ``close()``, within the limits
    above (``handler`` should derive from ``TimedRequestHandler`` for the read deadlines)."""

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], name: str, *,
                 idle_timeout_s: float = IDLE_TIMEOUT_S, read_timeout_s: float = READ_TIMEOUT_S,
                 max_connections: int = MAX_CONNECTIONS):
        self._server = _Server(address, handler, name=name, idle_timeout_s=idle_timeout_s,
                               read_timeout_s=read_timeout_s, max_connections=max_connections)
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
