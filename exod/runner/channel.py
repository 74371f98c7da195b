"""The runner's end of its one channel to the daemon, and the thread that watches it.

The daemon passes one end of a socketpair as an inherited fd (`--channel-fd`). Everything goes
through it, as `exod.messages` in `exod.protocol` frames: lifecycle reports and generation
events out (`send`, from any thread), requests in. Incoming requests land in `inbox` for the
main thread, except the ones that must act at once: `Shutdown` (stop) and `Cancel` (abort one
generation); `ClearCache` queues like a request. End of stream means the daemon is gone: stop.
The same thread watches the signal wakeup pipe (`exod.runner.lifecycle`). Without a channel (a
runner started by hand) it only watches for signals, and what would be sent is dropped.
"""

from __future__ import annotations

import os
import queue
import selectors
import socket
import threading
import time
from collections.abc import Sequence

from exod import messages as m
from exod.protocol import FrameDecoder, ProtocolError, encode
from exod.runner.lifecycle import Lifecycle
from exod.runner.log import ERR, log
from exod.runner.serving.reading import Read


class Channel:
    def __init__(self, fd: int | None, life: Lifecycle) -> None:
        self.sock = socket.socket(fileno=fd) if fd is not None else None
        self.life = life
        # None wakes the main thread (a stop); Generate and ClearCache queue. The serve loop's
        # reader hands its requests back here once read (exod.runner.serving.reading).
        self.inbox: queue.Queue[m.Generate | m.ClearCache | Read | None] = queue.Queue()
        self.cancelled: set[str] = set()
        self.drain: float | None = None  # seconds the daemon allows in-flight work to finish
        self.exit_by: float | None = None  # time.monotonic() the grace of a Shutdown ends
        self._send_lock = threading.Lock()
        life.on_stop(lambda: self.inbox.put(None))

    def start(self) -> None:
        """Say hello (the daemon checks the protocol version), then watch the channel."""
        self.send(m.Hello(version=m.VERSION, pid=os.getpid()))
        threading.Thread(target=self._watch, name="exod-channel", daemon=True).start()

    def send(self, msg: m.FromRunner) -> bool:
        return self.send_all([msg])

    def send_all(self, msgs: Sequence[m.FromRunner]) -> bool:
        """Several messages in one write: a batch step's events for every request in it cost
        one system call and one wake-up of the daemon, not one per request."""
        if self.sock is None or not msgs:
            return False
        data = b"".join(encode(m.to_wire(msg)) for msg in msgs)
        try:
            with self._send_lock:
                self.sock.sendall(data)
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
                    frames = decoder.feed(data) if data else None
                    msgs = [m.decode_to_runner(f) for f in frames] if frames is not None else None
                except (OSError, ProtocolError) as e:
                    log(f"channel to exod broken: {e}", ERR)
                    msgs = None
                if msgs is None:
                    sel.unregister(self.sock)
                    self.life.request_stop("daemon gone (channel closed)")
                    continue
                for msg in msgs:
                    self._dispatch(msg)

    def _dispatch(self, msg: m.ToRunner) -> None:
        if isinstance(msg, m.Shutdown):
            self.drain = msg.drain
            if msg.grace > 0:
                self.exit_by = time.monotonic() + msg.grace
            self.life.request_stop("asked by exod")
        elif isinstance(msg, m.Cancel):
            self.cancelled.add(msg.id)
        else:
            self.inbox.put(msg)
