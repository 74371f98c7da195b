"""The runner's side of the notify protocol: sd_notify datagrams through the sdnotify package.

The same messages work whether the parent is exod (which listens on NOTIFY_SOCKET itself) or
systemd (a runner can run as a plain Type=notify service). sdnotify swallows every error unless
debug is on, so we turn debug on and decide ourselves: a lost progress message must never kill
a load, but we want to know.
"""

from __future__ import annotations

import os
import sys
import threading

import sdnotify


class Notifier:
    def __init__(self) -> None:
        self._enabled = bool(os.environ.get("NOTIFY_SOCKET"))
        self._lock = threading.Lock()  # the heartbeat thread and the main thread both send
        self._warned = False
        self._n: sdnotify.SystemdNotifier | None = None
        if self._enabled:
            try:
                self._n = sdnotify.SystemdNotifier(debug=True)
            except OSError as e:
                self._warn(f"cannot open NOTIFY_SOCKET: {e}")

    def send(self, *lines: str) -> None:
        if self._n is None:
            return
        # sdnotify encodes latin-1, which raises on anything else. Handing it the UTF-8 bytes
        # spelled as latin-1 code points makes it put exactly those UTF-8 bytes on the wire.
        # X_EXOD_PID identifies us where the kernel passes no credentials (macOS); systemd
        # ignores unknown keys, so the message stays valid for it.
        lines = (*lines, f"X_EXOD_PID={os.getpid()}")
        text = "\n".join(lines).encode("utf-8").decode("latin-1")
        with self._lock:
            try:
                self._n.notify(text)
            except OSError as e:
                self._warn(f"notify failed: {e}")

    def _warn(self, msg: str) -> None:
        if not self._warned:
            self._warned = True
            print(f"exod.runner: {msg}", file=sys.stderr, flush=True)

    def status(self, text: str) -> None:
        self.send(f"STATUS={text}")

    def progress(self, n: int, total: int) -> None:
        self.send(f"X_EXOD_LAYERS={n}/{total}", f"STATUS=loading {n}/{total}")

    def ready(self) -> None:
        self.send("READY=1", "STATUS=ready")

    def stopping(self) -> None:
        self.send("STOPPING=1", "STATUS=stopping")

    def watchdog(self) -> None:
        self.send("WATCHDOG=1")

    def error(self, reason: str) -> None:
        one_line = " ".join(reason.split())
        self.send(f"STATUS=failed: {one_line}", f"X_EXOD_ERROR={one_line}")
