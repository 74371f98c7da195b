"""How the HTTP API stops listening without dropping a request (a daemon's stop, issue 45).

Closing a listening socket resets every connection still in its backlog: the kernel completed
their handshakes, their clients sent their requests, and they get ECONNRESET with no way to tell
whether the request ran. So at a stop, exod first takes the listening socket over (a duplicate
of its descriptor), lets the event loop's server go, then accepts what the backlog holds and
answers each with a 503 "exod is stopping" before it closes the socket for good. From then on a
new connection is refused by the kernel, which a client knows was never sent, and retries.

Connections the server took before the stop are answered by it: in-flight requests run on
through the ladder's drain; a connection whose request has not come yet is given until
`FIRST_REQUEST` for it before the server closes it (aiohttp closes a connection with no request
in progress at once when it shuts down).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
from typing import Any

# A request that a stopping daemon refuses: read whole (so that closing the socket sends a FIN,
# never a reset that could eat the answer), within READ_S, then answered and closed.
READ_S = 2.0
MAX_READ = 1 << 20  # bytes of a refused request read at most; past it, answered anyway
FIRST_REQUEST = 2.0  # seconds a connection taken before the stop has to send its request
# Connections taken from a backlog at most (twice the backlog exod asks for): a client that
# keeps connecting cannot hold a stop open.
MAX_TAKEN = 1024
MESSAGE = "exod is stopping: the request was not started; send it again in a moment"
BODY = json.dumps({"error": {"message": MESSAGE, "type": "service_unavailable_error",
                             "param": None, "code": "stopping"}}).encode()
ANSWER = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
          b"Connection: close\r\nRetry-After: 1\r\n"
          + f"Content-Length: {len(BODY)}\r\n\r\n".encode() + BODY)


class Refusal(asyncio.Protocol):
    """Reads one request (its head, and the body its Content-Length gives), then answers 503."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.timer: asyncio.TimerHandle | None = None

    def itself(self) -> Refusal:
        return self  # the protocol factory of the one connection it answers

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.timer = asyncio.get_running_loop().call_later(READ_S, self.answer)

    def data_received(self, data: bytes) -> None:
        self.data += data
        if self.whole() or len(self.data) >= MAX_READ:
            self.answer()

    def eof_received(self) -> bool | None:
        self.answer()
        return None

    def whole(self) -> bool:
        head, sep, body = bytes(self.data).partition(b"\r\n\r\n")
        if not sep:
            return False
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                try:
                    return len(body) >= int(value.strip())
                except ValueError:
                    return True
        return True  # no body, or a chunked one: answered after the head

    def answer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(ANSWER)
            self.transport.close()
        if not self.done.done():
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if not self.done.done():
            self.done.set_result(None)


async def stop_listening(server: asyncio.Server) -> list[asyncio.Future[None]]:
    """Close `server`'s listening sockets and answer what their backlogs hold; returns the
    answers under way, to be awaited before the loop ends."""
    loop = asyncio.get_running_loop()
    held = []
    for ts in server.sockets:
        s = socket.socket(fileno=os.dup(ts.fileno()))  # keeps the socket open past close()
        s.setblocking(False)
        held.append(s)
    server.close()
    answers: list[asyncio.Future[None]] = []
    for s in held:
        with s:
            for _ in range(MAX_TAKEN):  # until the backlog is empty; then closed in one step
                try:
                    conn, _ = s.accept()
                except OSError:  # BlockingIOError: the backlog is empty
                    break
                conn.setblocking(False)
                refusal = Refusal()
                await loop.connect_accepted_socket(refusal.itself, conn)
                answers.append(refusal.done)
    return answers


async def first_requests(connections: list[Any], seen: Any, deadline: float) -> None:
    """Wait until each open connection has sent a request (it is in `seen`) or `deadline`
    (loop time) passes: aiohttp's shutdown would close one that has not, unanswered."""
    loop = asyncio.get_running_loop()
    while loop.time() < deadline:
        waiting = [h for h in connections if h.transport is not None
                   and not h.transport.is_closing() and h.transport not in seen]
        if not waiting:
            return
        await asyncio.sleep(0.01)  # a request's bytes, parsed by the loop: nothing to await
