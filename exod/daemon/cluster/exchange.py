"""The asking side of an exchange: send this node's hello, read the answer and the probe's
bytes, time both. What the answer proves is the owner's to judge (discovery)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from exod.wire.announce import MAX_LINE, MAX_PROBE, hello_line, parse_line

MIB = 2**20


@dataclass(frozen=True)
class PeerReply:
    obj: dict[str, Any]  # the answer line: {"answer": signed} or {"refused": why}
    rtt: float  # seconds from the hello sent to the answer's line read
    seconds_per_mib: float | None  # the probe's bytes timed, when some were asked and came


async def ask(host: str, port: int, hello: dict[str, Any], probe: int,
              timeout: float) -> PeerReply:
    """One exchange; raises OSError (TimeoutError included) when the other end does not answer
    in time, `Refused` (exod.wire.announce) when its answer is not an exchange's."""
    async with asyncio.timeout(timeout):
        reader, writer = await asyncio.open_connection(host, port, limit=MAX_LINE)
        try:
            sent = time.monotonic()
            writer.write(hello_line(hello, min(probe, MAX_PROBE)))
            await writer.drain()
            try:
                line = await reader.readuntil(b"\n")
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError) as e:
                raise ConnectionError(f"no whole answer: {e}") from None
            rtt = time.monotonic() - sent
            obj = parse_line(line)
            per_mib = None
            if probe and "answer" in obj:
                start = time.monotonic()
                await reader.readexactly(min(probe, MAX_PROBE))
                per_mib = (time.monotonic() - start) / (min(probe, MAX_PROBE) / MIB)
            return PeerReply(obj, rtt, per_mib)
        finally:
            writer.close()
