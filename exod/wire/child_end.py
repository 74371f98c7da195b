"""A child process's end of its channel to whoever started it: a runner's, a fetcher's and the
split probe's, written once.

The parent passes one end of a socketpair as an inherited descriptor (`--channel-fd N`, the
only thing on the child's command line), carrying `exod.wire.protocol` frames. The child says
`Hello` with its protocol version (`start`); the parent's first frame then says what to do
(a start-up spec or a question, `exod.wire.specs`: `spec()` waits for it), and whatever follows is
read by a thread, checked against the messages this child takes, and handed to `on_message`.
End of stream, or a frame that is not one of those messages, ends the channel: `on_closed`,
with the reason when it was broken. The same thread may watch one more descriptor (a runner's
signal wake-up pipe, exod.runner.link.lifecycle). Without a channel (started by hand) nothing
arrives and what would be sent is dropped.
"""

from __future__ import annotations

import os
import selectors
import socket
import threading
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from exod.wire import messages as m
from exod.wire.protocol import FrameDecoder, ProtocolError, encode, from_wire, to_wire

S = TypeVar("S")
OnClosed = Callable[[str | None], None]  # why, when the channel broke; None: it just ended
Wake = tuple[int, Callable[[], None]]  # a descriptor to watch too, and what to do when readable


class ChildEnd(Generic[S]):
    def __init__(self, fd: int | None, first: dict[str, type[Any]],
                 then: dict[str, type[Any]]) -> None:
        """`first`: what the parent's first frame may be; `then`: the messages that follow."""
        self.sock = socket.socket(fileno=fd) if fd is not None else None
        self._first, self._then = first, then
        self._spec: S | None = None
        self._arrived = threading.Event()  # the first frame came, or is no longer waited for
        self._lock = threading.Lock()

    def start(self, on_message: Callable[[Any], None], on_closed: OnClosed,
              wake: Wake | None = None) -> None:
        """Say hello (the parent checks the protocol version), then watch the channel."""
        self.send(m.Hello(version=m.VERSION, pid=os.getpid()))
        if self.sock is None:
            self._arrived.set()
            if wake is None:
                return
        threading.Thread(target=self._watch, args=(on_message, on_closed, wake),
                         name="exod-channel", daemon=True).start()

    def spec(self, timeout: float | None = None) -> S | None:
        """The parent's first message: None when it did not come within `timeout`, when the
        channel ended first, or after `give_up` (the child is stopping anyway)."""
        self._arrived.wait(timeout)
        return self._spec

    def give_up(self) -> None:
        self._arrived.set()

    def send(self, msg: Any) -> bool:
        return self.send_all([msg])

    def send_all(self, msgs: Sequence[Any]) -> bool:
        """Several messages in one write (from any thread); False once the channel is gone."""
        if self.sock is None or not msgs:
            return False
        data = b"".join(encode(to_wire(msg)) for msg in msgs)
        try:
            with self._lock:
                self.sock.sendall(data)
            return True
        except OSError:
            return False

    def _decode(self, frame: dict[str, Any]) -> Any | None:
        """A message to hand on, or None for the first one (kept for `spec`)."""
        if self._spec is not None:
            return from_wire(frame, self._then)
        first = from_wire(frame, self._first)
        version = getattr(first, "version", None)
        if version != m.VERSION:
            raise ProtocolError(f"a {first.type} of protocol version {version}, this is "
                                f"{m.VERSION} (a stale install?)")
        self._spec = first
        self._arrived.set()
        return None

    def _watch(self, on_message: Callable[[Any], None], on_closed: OnClosed,
               wake: Wake | None) -> None:
        sel = selectors.DefaultSelector()
        if wake is not None:
            sel.register(wake[0], selectors.EVENT_READ, "wake")
        if self.sock is not None:
            sel.register(self.sock, selectors.EVENT_READ, "chan")
        decoder = FrameDecoder()
        while True:
            for key, _ in sel.select():
                if key.data == "wake":
                    assert wake is not None
                    wake[1]()
                    continue
                assert self.sock is not None
                why: str | None = None
                try:
                    data = self.sock.recv(65536)
                    frames = decoder.feed(data) if data else None
                    msgs = [self._decode(f) for f in frames] if frames is not None else None
                except (OSError, ProtocolError) as e:
                    why, msgs = str(e), None
                if msgs is None:
                    sel.unregister(self.sock)
                    self._arrived.set()
                    on_closed(why)
                    if wake is None:
                        return
                    continue
                for msg in msgs:
                    if msg is not None:
                        on_message(msg)
