"""The fetcher's end of its channel to the daemon: the same frames and messages as a runner's.

A thread watches the channel: a shutdown request (rung 1 of the ladder) or the daemon's end of
the channel closing ends the process at once. Whatever was downloaded stays on disk, and
huggingface_hub resumes from it next time.
"""

from __future__ import annotations

import os
import socket
import threading

from exod import messages as m
from exod.protocol import FrameDecoder, ProtocolError, encode


class Link:
    def __init__(self, fd: int | None) -> None:
        self.sock = socket.socket(fileno=fd) if fd is not None else None
        self._lock = threading.Lock()

    def start(self) -> None:
        self.send(m.Hello(version=m.VERSION, pid=os.getpid()))
        if self.sock is not None:
            threading.Thread(target=self._watch, name="exod-hub-channel", daemon=True).start()

    def send(self, msg: m.FromRunner) -> bool:
        if self.sock is None:
            return False
        try:
            with self._lock:
                self.sock.sendall(encode(m.to_wire(msg)))
            return True
        except OSError:
            return False

    def status(self, text: str) -> None:
        self.send(m.Status(phase=m.Phase.STARTING, text=text))

    def _watch(self) -> None:
        assert self.sock is not None
        decoder = FrameDecoder()
        while True:
            try:
                data = self.sock.recv(65536)
                frames = decoder.feed(data) if data else None
            except (OSError, ProtocolError):
                frames = None
            if frames is None:
                os._exit(0)  # the daemon is gone: nobody wants this download
            for frame in frames:
                if frame.get("type") == m.Shutdown.type:
                    self.send(m.Stopping(reason="stop requested"))
                    # Partial files stay: the next fetch resumes from them.
                    os._exit(0)
