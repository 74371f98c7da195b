"""The hop itself: the client's request, as it came (method, path, query, body, headers but the
hop's own: exod.api.proxy.headers), sent to the API of the node that runs the instance's rank 0
(exod.core.upstream), and its answer relayed as each piece arrives, an SSE stream chunk by
chunk. Connecting is bounded (a node that is down is a 503 naming it, never a hang); reading is
not: a slow generation that is making progress is never cut. A client that leaves cancels its
handler (the server's handler_cancellation), which closes the hop's connection, and rank 0's
node then cancels the generation as for any client that leaves.
"""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from exod.api.errors import ApiError
from exod.api.proxy.headers import HOP, back, onward
from exod.core.upstream import Upstream
from exod.daemon.ratelog import RateLimitedLog

CONNECT_S = 5.0  # a LAN answers a connection in milliseconds; a node down never does


def unreachable(instance: str, to: Upstream, why: str) -> ApiError:
    return ApiError(503, f"The model `{instance}` is served by exod on node {to.node!r} (its "
                         f"rank 0 runs there), which this node cannot reach at {to.origin}: "
                         f"{why}. Retry, or send the request to another node.",
                    "service_unavailable_error", "node_unreachable",
                    headers={"Retry-After": "5"})


def looped(instance: str, to: Upstream, sender: str) -> ApiError:
    return ApiError(503, f"The model `{instance}` came here from node {sender!r}, which takes "
                         "this node to run its rank 0, while this node takes node "
                         f"{to.node!r} to: the nodes' configs disagree about `hosts`.",
                    "service_unavailable_error", "served_elsewhere")


class Proxy:
    def __init__(self, node: str, keepalive: float, ratelog: RateLimitedLog) -> None:
        """`node`: this node's name (named to the other node on the hop); `keepalive`: how long
        an idle connection to another node is kept for the next request, below the other
        node's api.header_timeout, so that it is never reused as the other end closes it."""
        self.node = node
        self.keepalive = keepalive
        self.ratelog = ratelog
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            # No limit on connections (a stream holds one for its whole answer), no read
            # timeout, bytes passed as they are (no decompression, no headers of its own).
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=self.keepalive),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_S),
                auto_decompress=False, skip_auto_headers=("Accept-Encoding", "User-Agent"))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def forward(self, request: web.Request, to: Upstream, instance: str
                      ) -> web.StreamResponse:
        """The answer of `to` (rank 0's node of `instance`) to `request`, relayed."""
        sender = request.headers.get(HOP)
        if sender is not None:
            raise looped(instance, to, sender)
        body = await request.read()  # read already by the dialect: aiohttp keeps it
        try:
            upstream = await self.session().request(
                request.method, to.origin + request.rel_url.path_qs, data=body or None,
                headers=onward(request.headers.items(), self.node), allow_redirects=False)
        except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as e:
            why = _why(e)
            self.ratelog.warning(f"proxy:{to.origin}", "cannot reach node {} at {} for `{}`: {}",
                                 to.node, to.origin, instance, why)
            raise unreachable(instance, to, why) from None
        try:
            return await self._relay(request, upstream, to, instance)
        finally:
            if upstream.content.at_eof():
                upstream.release()
            else:  # a connection with an answer unread (a client that left) is not reused
                upstream.close()

    async def _relay(self, request: web.Request, upstream: aiohttp.ClientResponse,
                     to: Upstream, instance: str) -> web.StreamResponse:
        resp = web.StreamResponse(status=upstream.status, reason=upstream.reason,
                                  headers=CIMultiDict(back(upstream.headers.items())))
        chunked = "chunked" in upstream.headers.get("Transfer-Encoding", "").lower()
        if upstream.content_length is not None and not chunked:
            resp.content_length = upstream.content_length
        try:
            await resp.prepare(request)
            async for chunk in upstream.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
        except ConnectionError:
            pass  # the client left: closing the hop's connection (the caller) cancels there
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:  # the other node, mid-answer
            self.ratelog.warning(f"proxy-cut:{to.origin}", "node {} ended its answer for `{}` "
                                 "before its end: {}", to.node, instance, _why(e))
            if request.transport is not None:
                request.transport.close()  # the client sees a cut answer, not a whole one
        return resp


def _why(e: BaseException) -> str:
    if isinstance(e, asyncio.TimeoutError):
        return f"no connection within {CONNECT_S:g}s"
    if isinstance(e, aiohttp.ClientConnectorError):
        return e.strerror or type(e).__name__
    return str(e) or type(e).__name__
