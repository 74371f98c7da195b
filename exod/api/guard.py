"""A cap on the HTTP API's open connections, so that a flood of idle or half-sent requests can
neither use up the daemon's file descriptors nor lock out /health and real clients.

At the cap, a new connection makes room by closing the oldest one that has no request in
progress (an idle keep-alive, or a client still dribbling its request head: what a slowloris
holds). When every connection is busy with a request, the new one gets a 503 and is closed.
The head of every request must also arrive within `header_timeout` (aiohttp's keep-alive
timer, which runs from a connection's start and from each answer, until a request is parsed).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from exod.api.stopping import stop_listening
from exod.daemon.ratelog import RateLimitedLog

REFUSAL = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
           b"Connection: close\r\nRetry-After: 1\r\nContent-Length: 118\r\n\r\n"
           b'{"error": {"message": "too many connections: every one is busy", '
           b'"type": "service_unavailable_error", "param": null, "code": null}}')


class _Refuse(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.write(REFUSAL)
        transport.close()


class ConnectionGuard:
    def __init__(self, limit: int, log: RateLimitedLog) -> None:
        self.limit = limit
        self.busy: set[Any] = set()  # transports with a request in progress
        # Transports that have sent a request: at a stop, the others are given a moment to.
        self.seen: weakref.WeakSet[Any] = weakref.WeakSet()
        self.evicted = 0
        self.refused = 0
        self._log = log

    def factory(self, server: web.Server) -> Callable[[], asyncio.BaseProtocol]:
        def make() -> asyncio.BaseProtocol:
            # Closed ones linger in the list until the loop runs their connection_lost.
            conns = [h for h in server.connections
                     if h.transport is not None and not h.transport.is_closing()]
            if len(conns) >= self.limit:
                idle = next((h for h in conns if h.transport not in self.busy), None)
                if idle is None:
                    self.refused += 1
                    self._log.warning("api-cap", "HTTP API: {} connections, all busy: refusing "
                                      "new ones (api.max_connections)", len(conns))
                    return _Refuse()
                self.evicted += 1
                self._log.warning("api-evict", "HTTP API: {} connections open: closing the "
                                  "oldest idle ones (api.max_connections)", len(conns))
                idle.force_close()
            return _no_echo(server())

        return make


MALFORMED = "Bad Request: the request line or a header is malformed."


class _NoEcho(RequestHandler):
    """aiohttp answers a request it cannot parse with the bytes it choked on, a header line
    that may hold a key: this answers with a fixed text instead (and exod.api.httplog logs the
    exception's first line, which names the fault, not the bytes)."""

    __slots__ = ()  # aiohttp's handler has slots: same layout, so a handler can become one

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        return super().handle_error(request, status, exc, MALFORMED if message else None)


def _no_echo(handler: RequestHandler) -> RequestHandler:
    handler.__class__ = _NoEcho
    return handler


class GuardedSite(web.BaseSite):
    """aiohttp's TCPSite, with the connection guard between the socket and the server."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int,
                 guard: ConnectionGuard) -> None:
        super().__init__(runner, backlog=512)
        self._host = host
        self._port = port
        self._guard = guard

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    @property
    def port(self) -> int:
        """The port bound (the one chosen for port 0)."""
        assert isinstance(self._server, asyncio.Server) and self._server.sockets
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._guard.factory(server), self._host,
                                                self._port, backlog=self._backlog,
                                                reuse_address=True)

    async def stop_listening(self) -> list[asyncio.Future[None]]:
        """Stop taking connections, answering (503) those the backlog holds
        (exod.api.stopping); what is under way is returned. Once only."""
        server, self._server = self._server, None
        if not isinstance(server, asyncio.Server):
            return []
        return await stop_listening(server)

