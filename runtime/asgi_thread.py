"""Serve an ASGI app on uvicorn from a daemon thread with its own event loop: the worker's codec server,
health probes and GitHub webhook receiver.

Why uvicorn: a well-kept HTTP server whose connections are asyncio protocols, not threads, so a thousand
idle or trickling clients cost memory, not a thread pool that a few dozen slow clients fill (the
hand-written ``ThreadingHTTPServer`` answered everyone past 32 connections 503, /livez included). Why a
thread with its own loop: a probe and a webhook must be answered while the worker's loop is busy.

Limits: ``h11_max_incomplete_event_size`` bounds a request line and headers; a request's line and headers
must arrive within ``header_timeout_s`` of the connection (or of the previous response, on keep-alive), or
the connection is closed (uvicorn has no such timeout of its own: ``_DeadlineH11`` adds it); an idle
keep-alive connection is closed after ``keep_alive_s``; ``max_connections`` open connections at most (one
more is answered 503 by uvicorn); body size, body read time and concurrent handlers are the app's own
(``read_body`` below).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol


class BodyTooLarge(Exception):
    pass


async def read_body(receive, limit: int, timeout_s: float) -> bytes:
    """The request body, at most ``limit`` bytes, within ``timeout_s``: ``BodyTooLarge`` past the limit
    (stopped reading at once), ``TimeoutError`` past the time, ``ConnectionError`` when the client left."""
    chunks: list[bytes] = []
    size = 0

    async def read() -> bytes:
        nonlocal size
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ConnectionError("client disconnected")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge(f"body over {limit} bytes")
            chunks.append(chunk)
            if not message.get("more_body"):
                return b"".join(chunks)

    return await asyncio.wait_for(read(), timeout_s)


def _protocol(header_timeout_s: float) -> type[H11Protocol]:
    class _DeadlineH11(H11Protocol):
        """uvicorn's h11 protocol with a deadline for each request's line and headers."""

        _deadline: asyncio.TimerHandle | None = None

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(header_timeout_s, self._expire)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expire(self) -> None:
            self._deadline = None
            if (self.cycle is None or self.cycle.response_complete) and not self.transport.is_closing():
                self.transport.close()  # the headers never came: a trickling or silent client

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def handle_events(self) -> None:
            super().handle_events()
            if self.cycle is not None and not self.cycle.response_complete:
                self._disarm()  # the headers are in: the app's own time starts

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

    return _DeadlineH11


class ASGIThread:
    """``app`` served on ``(host, port)`` (0: any free port) from a daemon thread until ``close()``; the
    socket is bound here, so a taken port raises ``OSError`` at once."""

    def __init__(self, app, host: str, port: int, name: str, *, header_timeout_s: float = 10.0,
                 keep_alive_s: int = 5, max_connections: int = 1000, max_header_bytes: int = 16 * 1024):
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, port))
            self._sock.listen(2048)
        except OSError:
            self._sock.close()
            raise
        config = uvicorn.Config(app, http=_protocol(header_timeout_s), interface="asgi3", lifespan="off",
                                access_log=False, proxy_headers=False,
                                log_config=None, log_level="warning", timeout_keep_alive=keep_alive_s,
                                limit_concurrency=max_connections, h11_max_incomplete_event_size=max_header_bytes,
                                server_header=False, date_header=False)
        self._server = uvicorn.Server(config)
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self._started.wait(10)

    def _run(self) -> None:
        async def serve() -> None:
            self._started.set()
            await self._server.serve(sockets=[self._sock])

        with contextlib.suppress(Exception):
            asyncio.run(serve())

    @property
    def port(self) -> int:
        return self._sock.getsockname()[1]

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        with contextlib.suppress(OSError):
            self._sock.close()
