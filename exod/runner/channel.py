"""The runner's end of its channel to the daemon, and the thread that watches it.

The daemon passes one end of a socketpair as an inherited fd (`--channel-fd`). Messages in
(`exod.protocol` frames) land in `inbox` for the main thread, except the ones that must act at
once: `shutdown` (stop) and `cancel` (abort one generation). End of stream means the daemon is
gone: stop. Without a channel (a runner started by hand or by systemd) the same thread only
watches for signals.
"""

from __future__ import annotations

import queue
import selectors
import socket
import threading

from exod.protocol import FrameDecoder, Message, ProtocolError, encode
from exod.runner.lifecycle import Lifecycle

STOP = {"op": "_stop"}  # sentinel put in the inbox to wake the main thread


class Channel:
    def __init__(self, fd: int | None, life: Lifecycle) -> None:
        self.sock = socket.socket(fileno=fd) if fd is not None else None
        self.life = life
        self.inbox: queue.Queue[Message] = queue.Queue()
        self.cancelled: set[str] = set()
        self.drain: float | None = None  # seconds the daemon allows in-flight work to finish
        self._send_lock = threading.Lock()
        life.on_stop(lambda: self.inbox.put(STOP))

    def start(self) -> None:
        threading.Thread(target=self._watch, name="exod-channel", daemon=True).start()

    def send(self, msg: Message) -> bool:
        if self.sock is None:
            return False
        try:
            with self._send_lock:
                self.sock.sendall(encode(msg))
            return True
        except OSError:
            return False

    def _watch(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self.life.wake_r, selectors.EVENT_READ, "wake")
        if self.sock is not None:
            sel.register(self.sock, selectors.EVENT_READ, "chan")
        decoder = FrameDecoder()
        while True:
            for key, _ in sel.select():
                if key.data == "wake":
                    self.life.take_signal()
                    continue
                assert self.sock is not None
                try:
                    data = self.sock.recv(65536)
                    msgs = decoder.feed(data) if data else None
                except (OSError, ProtocolError):
                    msgs = None
                if msgs is None:
                    sel.unregister(self.sock)
                    self.life.request_stop("daemon gone (channel closed)")
                    continue
                for msg in msgs:
                    self._dispatch(msg)

    def _dispatch(self, msg: Message) -> None:
        op = msg.get("op")
        if op == "shutdown":
            drain = msg.get("drain")
            self.drain = float(drain) if isinstance(drain, (int, float)) else 0.0
            self.life.request_stop("asked by exod")
        elif op == "cancel":
            self.cancelled.add(str(msg.get("id")))
        else:
            self.inbox.put(msg)
