"""This node's cluster endpoint (TCP, `cluster.listen`): one exchange per connection, or one
file ask of a peer (a line `{"file": ...}`: exod.daemon.cluster.file_server).

A hello that proves the key is answered with this node's signed record and the probe's bytes;
any other gets one `refused` line and nothing of this node. Bounded: a line of at most
MAX_LINE bytes within READ_TIMEOUT, and at most MAX_CONNECTIONS at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from loguru import logger

from exod.wire.announce import MAX_LINE, MAX_PROBE, Refused, answer_line, parse_line, \
    refused_line

READ_TIMEOUT = 5.0
MAX_CONNECTIONS = 64
_PROBE_CHUNK = bytes(64 * 1024)

# (the hello's signed record, the address it came from) -> this node's signed answer;
# raises Refused.
Answerer = Callable[[Any, str], dict[str, Any]]
# A file ask's signed body, the address it came from, the connection: answers it in full
# (exod.daemon.cluster.file_server).
FileAnswerer = Callable[[Any, str, asyncio.StreamWriter], Awaitable[None]]


class Endpoint:
    def __init__(self, host: str, port: int, answer: Answerer,
                 files: FileAnswerer | None = None) -> None:
        self.host, self.port = host, port
        self.answer = answer
        self.files = files
        self.server: asyncio.Server | None = None
        self.open = 0

    async def start(self) -> int:
        """Listen; the port bound (port 0 picks one)."""
        self.server = await asyncio.start_server(self._serve, self.host, self.port,
                                                 limit=MAX_LINE)
        return int(self.server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open += 1
        try:
            if self.open <= MAX_CONNECTIONS:
                await self._exchange(reader, writer)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                TimeoutError) as e:
            logger.debug("cluster: an exchange ended early: {}", e)
        finally:
            self.open -= 1
            writer.close()

    async def _exchange(self, reader: asyncio.StreamReader,
                        writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        address = str(peer[0]) if peer else "?"
        async with asyncio.timeout(READ_TIMEOUT):
            line = await reader.readuntil(b"\n")
        probe = 0
        try:
            obj = parse_line(line)
            if "file" in obj and self.files is not None:
                await self.files(obj["file"], address, writer)
                return
            raw = obj.get("probe", 0)
            probe = raw if isinstance(raw, int) and 0 <= raw <= MAX_PROBE else 0
            signed = self.answer(obj.get("hello"), address)
        except Refused as e:
            writer.write(refused_line(e.reason))
            await writer.drain()
            return
        writer.write(answer_line(signed))
        while probe > 0:
            chunk = _PROBE_CHUNK[:probe]
            writer.write(chunk)
            probe -= len(chunk)
            await writer.drain()
        await writer.drain()
