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

from exod.sdnotify_wire import one_line, wire


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
        # X_EXOD_PID identifies us where the kernel passes no credentials (macOS); systemd
        # ignores unknown keys, so the message stays valid for it.
        text = wire((*lines, f"X_EXOD_PID={os.getpid()}"))
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
        reason = one_line(reason)
        self.send(f"STATUS=failed: {reason}", f"X_EXOD_ERROR={reason}")
