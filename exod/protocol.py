"""Framing for the daemon ↔ runner channel: a stream socket carrying length-prefixed JSON.

Each frame is a 4-byte big-endian length then that many bytes of UTF-8 JSON (an object); what
the objects say is `exod.messages`.
JSON, not pickle: a runner must never be able to make the daemon execute anything.
Shared by both sides; imports nothing heavy.
"""

from __future__ import annotations

import json
import struct
from typing import Any

HEADER = struct.Struct("!I")
MAX_FRAME = 64 * 1024 * 1024  # far above any real message; stops a corrupt length from OOMing us

Message = dict[str, Any]


class ProtocolError(Exception):
    pass


def encode(msg: Message) -> bytes:
    body = json.dumps(msg, separators=(",", ":"), ensure_ascii=False).encode()
    return HEADER.pack(len(body)) + body


class FrameDecoder:
    """Incremental decoder: feed bytes as they arrive, get whole messages back."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Message]:
        self._buf += data
        out: list[Message] = []
        while len(self._buf) >= HEADER.size:
            (n,) = HEADER.unpack_from(self._buf)
            if n > MAX_FRAME:
                raise ProtocolError(f"frame of {n} bytes exceeds the {MAX_FRAME} limit")
            if len(self._buf) < HEADER.size + n:
                break
            body = bytes(self._buf[HEADER.size : HEADER.size + n])
            del self._buf[: HEADER.size + n]
            out.append(parse(body))
        return out


def parse(body: bytes) -> Message:
    """One frame's JSON object, or ProtocolError (never another exception: a peer's bytes
    must not be able to raise anything else, e.g. RecursionError from deep nesting)."""
    try:
        msg = json.loads(body)
    except (ValueError, RecursionError) as e:
        raise ProtocolError(f"bad JSON frame: {_short(e)}") from None
    if not isinstance(msg, dict):
        raise ProtocolError("a frame must hold a JSON object")
    return msg


def _short(e: Exception) -> str:
    return "nested too deeply" if isinstance(e, RecursionError) else str(e)
