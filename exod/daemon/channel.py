"""The daemon's end of one child's channel (a runner's, or a fetcher's): typed messages both
ways, requests by id.

Frames (`exod.wire.protocol`) carry `exod.wire.messages`: the child says Hello first; once its
version matches, the daemon's first frame is the child's start-up spec (`exod.wire.specs`), and
only then whatever was queued for it. Lifecycle reports go to `on_message`; a request's events,
in order and ending with Done or Error, to that request's `RequestStream`. What a child says is
checked against its own union (`decode`: a runner's messages, or a fetcher's).

The channel is an asyncio stream read by one task, with a frame-size limit. A frame that is not
a valid message, a version other than ours, or anything before Hello is a protocol error:
logged once, reported to `on_broken` (which ends the runner through the ladder), and nothing
more is read; it never raises into the event loop. When the runner goes away, every open
request gets a final Error event, so no request ever waits for a runner that is gone.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import socket
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from loguru import logger

from exod.wire import messages as m
from exod.wire.protocol import HEADER, MAX_FRAME, ProtocolError, encode, parse

MAX_PENDING = 4096  # events waiting for a client: a slow reader beyond this is dropped
# What the stream buffers ahead of the reader. A frame may still be up to MAX_FRAME (readexactly
# resumes a paused stream), but a runner that floods small frames faster than the daemon handles
# them fills at most twice this before it is made to wait, not twice MAX_FRAME.
READ_AHEAD = 256 * 1024
# A runner's frames are small (a piece of text, a reason); requests to it may be larger, up to
# MAX_FRAME (a bigger request is refused here: api.max_body_kib may allow more, and the runner
# would take such a frame for a broken channel). A bigger frame from a runner is a broken
# runner, refused before it is read into memory.
MAX_RUNNER_FRAME = 1024 * 1024
YIELD_EVERY = 8  # frames read between turns of the loop (bench hostile_runner)
M = TypeVar("M")


class TooLarge(Exception):
    """A request bigger, once encoded, than a runner takes (MAX_FRAME)."""

    def __init__(self, size: int) -> None:
        super().__init__(f"{size} bytes")
        self.size = size


class RequestStream:
    """The events of one request, in order. The last one is Done or Error."""

    def __init__(self, link: RunnerChannel[Any], rid: str) -> None:
        self.link = link
        self.id = rid
        self.finished = False
        # Called for every event the runner sends for it, as it arrives: the runner's progress,
        # whether or not the client reads it (hang detection, exod.daemon.hang).
        self.on_event: Callable[[], None] | None = None
        self._queue: asyncio.Queue[m.Event] = asyncio.Queue()

    def _put(self, ev: m.Event) -> None:
        if self.finished:
            return  # dropped for reading too slowly (below): the rest is not wanted
        if isinstance(ev, (m.Done, m.Error)):
            self.finished = True
        elif self._queue.qsize() >= MAX_PENDING:
            # The client reads far slower than the runner writes: end it rather than buffer
            # without bound (the runner is told to stop, as for a client that left).
            self.finished = True
            while not self._queue.empty():
                self._queue.get_nowait()
            ev = m.Error(self.id, "aborted", "the client read the answer too slowly")
            self.link.send(m.Cancel(self.id))
        self._queue.put_nowait(ev)

    async def next(self) -> m.Event:
        return await self._queue.get()

    def fail(self, code: m.ErrorCode, message: str) -> None:
        """End it from the daemon's side (e.g. the runner is hung): a final error event."""
        if not self.finished:
            self._put(m.Error(self.id, code, message))
            self.link._forget(self.id, cancel=True)

    def close(self) -> None:
        """Done with it: if the runner is still working on it, tell it to stop (cancel)."""
        if not self.finished:
            self.finished = True
            self.link._forget(self.id, cancel=True)


class RunnerChannel(Generic[M]):
    def __init__(self, sock: socket.socket, context: dict[str, Any], spec: Any,
                 decode: Callable[[dict[str, Any]], M], on_message: Callable[[M], None],
                 on_broken: Callable[[str], None]) -> None:
        self.log = logger.bind(**context)
        self.closed = False
        self.broken = False  # closed for a protocol error (already reported to on_broken)
        self.hello: m.Hello | None = None
        self._spec = encode(m.to_wire(spec))
        self._decode = decode
        self._on_message = on_message
        self._on_broken = on_broken
        self._streams: dict[str, RequestStream] = {}
        self._ids = itertools.count(1)
        self._writer: asyncio.StreamWriter | None = None
        # Frames to send once the spec is sent (it goes first, after the hello).
        self._pending: list[bytes] = []
        self.reader_task = asyncio.get_running_loop().create_task(self._read_all(sock))

    @property
    def in_flight(self) -> int:
        return len(self._streams)

    # ---- sending ----------------------------------------------------------------------------
    def send(self, msg: m.ToRunner) -> bool:
        """Queue one message; False if the channel is already closed. Messages are small and
        few (requests are bounded by the API's body limit), so the writer's buffer is enough."""
        if self.closed:
            return False
        return self._send_frame(encode(m.to_wire(msg)))

    def _send_frame(self, data: bytes) -> bool:
        if self.closed:
            return False
        if self._writer is None or self.hello is None:
            self._pending.append(data)
        else:
            self._writer.write(data)
        return True

    def open(self, request: m.Work) -> RequestStream:
        """Send a request (its id is set here); its events arrive on the stream."""
        rid = f"r{next(self._ids)}"
        stream = RequestStream(self, rid)
        data = encode(m.to_wire(dataclasses.replace(request, id=rid)))
        if len(data) - HEADER.size > MAX_FRAME:
            raise TooLarge(len(data) - HEADER.size)
        if not self._send_frame(data):
            stream._put(m.Error(rid, "runner_gone", "the runner is gone"))
            return stream
        self._streams[rid] = stream
        return stream

    def _forget(self, rid: str, cancel: bool) -> None:
        if self._streams.pop(rid, None) is not None and cancel:
            self.send(m.Cancel(rid))

    # ---- receiving --------------------------------------------------------------------------
    async def _read_all(self, sock: socket.socket) -> None:
        try:
            reader, self._writer = await asyncio.open_unix_connection(sock=sock,
                                                                      limit=READ_AHEAD)
            for n in itertools.count(1):
                if self.closed:
                    break
                self._deliver(await _read_frame(reader))
                if n % YIELD_EVERY == 0:
                    # A read of buffered frames never yields to the loop by itself: a flooding
                    # runner would starve the API and the control socket.
                    await asyncio.sleep(0)
        except (asyncio.IncompleteReadError, ConnectionError):
            self.close("the runner exited mid-request")
        except ProtocolError as e:
            why = f"protocol error from the runner: {e}"
            self.log.error("{}", why)
            self.broken = True
            self.close(why)
            self._on_broken(why)
        except OSError as e:
            self.close(f"runner channel failed: {e}")

    def _deliver(self, frame: dict[str, Any]) -> None:
        msg: Any = self._decode(frame)
        if self.hello is None:
            if not isinstance(msg, m.Hello):
                raise ProtocolError(f"{msg.type} before hello")
            if msg.version != m.VERSION:
                raise ProtocolError(f"the runner speaks version {msg.version}, exod "
                                    f"{m.VERSION} (a stale install? restart exod)")
            self.hello = msg
            assert self._writer is not None  # open before anything is read
            self._writer.write(self._spec)  # what it is to do, before anything else
            for data in self._pending:
                self._writer.write(data)
            self._pending.clear()
            return
        if isinstance(msg, (m.Prefill, m.Held, m.Text, m.ToolCall, m.Vectors, m.Done, m.Error)):
            stream = self._streams.get(msg.id)
            if stream is None:
                return  # a late event for a request that was cancelled
            stream._put(msg)
            if stream.on_event is not None:
                stream.on_event()
            if stream.finished:
                del self._streams[stream.id]
            return
        self._on_message(msg)

    def close(self, reason: str) -> None:
        """The runner is gone (or going): fail what is still open. Idempotent."""
        if self.closed:
            return
        self.closed = True
        if self._writer is not None:
            self._writer.close()
        task = self.reader_task
        if task is not asyncio.current_task() and not task.done():
            task.cancel()
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            stream._put(m.Error(stream.id, "runner_gone", reason))


async def _read_frame(reader: asyncio.StreamReader) -> dict[str, Any]:
    (n,) = HEADER.unpack(await reader.readexactly(HEADER.size))
    if n > MAX_RUNNER_FRAME:
        raise ProtocolError(f"frame of {n} bytes exceeds the {MAX_RUNNER_FRAME} limit")
    return parse(await reader.readexactly(n))
