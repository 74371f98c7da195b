"""The daemon's end of one runner's channel: frames out, frames in, requests multiplexed by id.

Both directions carry `exod.protocol` frames. Daemon → runner:
  {"op": "shutdown", "drain": S}           rung 1 of the ladder: finish in-flight work within S
  {"op": "generate", "id": ID, ...}        start a generation (fields: see exod.api.schema)
  {"op": "cancel", "id": ID}               the client went away: stop that generation now
Runner → daemon, one stream of events per request id, in order, ending with done or error:
  {"id": ID, "ev": "text", "text": "..."}  the next piece of text, as soon as it is decoded
  {"id": ID, "ev": "done", "finish_reason": "stop"|"length",
   "prompt_tokens": N, "completion_tokens": M}
  {"id": ID, "ev": "error", "code": "...", "message": "..."}

Everything runs on the event loop, without blocking: reads are driven by `add_reader`, and a
write the socket cannot take at once waits in a buffer flushed by `add_writer`. When the runner
goes away (end of stream, or its exit is reaped) every open request gets a final error event,
so no request ever waits for a runner that is gone.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
from typing import Any

from loguru import logger

from exod.protocol import FrameDecoder, Message, ProtocolError, encode

FINAL = ("done", "error")


class RequestStream:
    """The events of one request, in order. The last one is `done` or `error`."""

    def __init__(self, link: Link, rid: str) -> None:
        self.link = link
        self.id = rid
        self.finished = False
        self._queue: asyncio.Queue[Message] = asyncio.Queue()

    def _put(self, msg: Message) -> None:
        if msg.get("ev") in FINAL:
            self.finished = True
        self._queue.put_nowait(msg)

    async def next(self) -> Message:
        return await self._queue.get()

    def fail(self, code: str, message: str) -> None:
        """End it from the daemon's side (e.g. the runner is hung): a final error event."""
        if not self.finished:
            self._put({"id": self.id, "ev": "error", "code": code, "message": message})
            self.link._forget(self.id, cancel=True)

    def close(self) -> None:
        """Done with it: if the runner is still working on it, tell it to stop (cancel)."""
        if not self.finished:
            self.finished = True
            self.link._forget(self.id, cancel=True)


class Link:
    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket,
                 context: dict[str, Any]) -> None:
        self.loop = loop
        self.sock = sock
        self.fd = sock.fileno()
        self.log = logger.bind(**context)
        self.closed = False
        self._decoder = FrameDecoder()
        self._out = bytearray()
        self._streams: dict[str, RequestStream] = {}
        self._ids = itertools.count(1)
        loop.add_reader(self.fd, self._on_readable)

    @property
    def in_flight(self) -> int:
        return len(self._streams)

    # ---- sending ----------------------------------------------------------------------
    def send(self, msg: Message) -> bool:
        """Queue one frame; False if the channel is already closed."""
        if self.closed:
            return False
        data = encode(msg)
        if self._out:  # keep the order: behind what is already waiting
            self._out += data
            return True
        try:
            n = self.sock.send(data)
        except BlockingIOError:
            n = 0
        except OSError as e:
            self.close(f"runner channel failed: {e}")
            return False
        if n < len(data):
            self._out += data[n:]
            self.loop.add_writer(self.fd, self._on_writable)
        return True

    def _on_writable(self) -> None:
        try:
            n = self.sock.send(self._out)
        except BlockingIOError:
            return
        except OSError as e:
            self.close(f"runner channel failed: {e}")
            return
        del self._out[:n]
        if not self._out:
            self.loop.remove_writer(self.fd)

    def open(self, request: Message) -> RequestStream:
        """Send a generation request; its events arrive on the returned stream."""
        rid = f"r{next(self._ids)}"
        stream = RequestStream(self, rid)
        if self.closed or not self.send({**request, "op": "generate", "id": rid}):
            stream._put({"id": rid, "ev": "error", "code": "runner_gone",
                         "message": "the runner is gone"})
            return stream
        self._streams[rid] = stream
        return stream

    def _forget(self, rid: str, cancel: bool) -> None:
        if self._streams.pop(rid, None) is not None and cancel:
            self.send({"op": "cancel", "id": rid})

    # ---- receiving ----------------------------------------------------------------------
    def _on_readable(self) -> None:
        try:
            data = self.sock.recv(1 << 20)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.close("the runner exited mid-request")
            return
        self._feed(data)

    def _feed(self, data: bytes) -> None:
        try:
            msgs = self._decoder.feed(data)
        except ProtocolError as e:
            self.log.error("runner channel: {}", e)  # noqa: PLE1205 (loguru formats {})
            self.close(f"protocol error from the runner: {e}")
            return
        for msg in msgs:
            stream = self._streams.get(str(msg.get("id")))
            if stream is None:
                continue  # a late event for a request that was cancelled
            stream._put(msg)
            if stream.finished:
                del self._streams[stream.id]

    def close(self, reason: str) -> None:
        """The runner is gone (or going): deliver what it sent, then fail what is still open."""
        if self.closed:
            return
        self.closed = True
        try:  # its last words (e.g. the final events of a drain) may still sit in the socket
            while data := self.sock.recv(1 << 20):
                self._feed(data)
        except OSError:
            pass
        self.loop.remove_reader(self.fd)
        if self._out:
            self.loop.remove_writer(self.fd)
            self._out.clear()
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            stream._put({"id": stream.id, "ev": "error", "code": "runner_gone", "message": reason})
