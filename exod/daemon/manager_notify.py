"""Talking to the service manager: sd_notify for systemd, a Darwin notification for launchd.

A thin layer over the sdnotify package, minding its traps: it encodes latin-1 (we hand it UTF-8
bytes spelled as latin-1 so the wire carries UTF-8), and it swallows errors unless debug is on
(we turn debug on and log the first failure). Without NOTIFY_SOCKET every call does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import sys
import time
from collections.abc import Iterable

import sdnotify
from loguru import logger

DARWIN_READY_NAME = "io.exod.ready"  # notifyutil -w io.exod.ready


def wire(lines: Iterable[str]) -> str:
    """The datagram's text for the sdnotify package. It encodes latin-1, which raises on
    anything else: handed the UTF-8 bytes spelled as latin-1 code points, it puts exactly
    those UTF-8 bytes on the wire."""
    return "\n".join(lines).encode("utf-8").decode("latin-1")


def one_line(text: str) -> str:
    """A value fit for a KEY=VALUE line (STATUS=): whitespace runs to a space."""
    return " ".join(text.split())


def watchdog_interval() -> float | None:
    """Half of WATCHDOG_USEC, if the watchdog is meant for this process (WATCHDOG_PID)."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 2e6 if value > 0 else None


def monotonic_usec() -> int:
    """CLOCK_MONOTONIC in µs, as systemd expects in MONOTONIC_USEC=."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


# Messages where only the latest matters: a newer one replaces an unsent older one.
COALESCE = ("STATUS=", "EXTEND_TIMEOUT_USEC=", "WATCHDOG=")


class ServiceNotifier:
    """sd_notify from inside the event loop, which must never block: once `attach`ed, the
    socket is non-blocking and messages the manager is not reading yet wait in a queue
    (flushed when the socket turns writable) instead of stalling the daemon."""

    def __init__(self) -> None:
        self.enabled = bool(os.environ.get("NOTIFY_SOCKET"))
        self._n: sdnotify.SystemdNotifier | None = None
        self._warned = False
        self._last_status = ""
        self._pending: list[str] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        if self.enabled:
            try:
                self._n = sdnotify.SystemdNotifier(debug=True)
            except Exception as e:  # noqa: BLE001 -- sdnotify re-raises anything from socket setup
                self._warn(f"cannot open NOTIFY_SOCKET {os.environ.get('NOTIFY_SOCKET')}: {e}")

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._n is not None and self._n.socket is not None:
            self._n.socket.setblocking(False)
            self._loop = loop

    def send(self, *lines: str) -> bool:
        if self._n is None:
            return False
        text = wire(lines)
        if len(lines) == 1 and lines[0].startswith(COALESCE):
            key = lines[0].split("=", 1)[0] + "="
            self._pending = [p for p in self._pending if not (p.startswith(key) and "\n" not in p)]
        self._pending.append(text)
        return self._flush()

    def _flush(self) -> bool:
        assert self._n is not None
        while self._pending:
            try:
                self._n.notify(self._pending[0])
            except BlockingIOError:
                if self._loop is not None:
                    self._loop.add_writer(self._n.socket.fileno(), self._flush)
                return False
            except Exception as e:  # noqa: BLE001 -- a failed sd_notify must not stop the daemon
                self._warn(f"sd_notify failed: {e}")
                self._pending.clear()
                return False
            self._pending.pop(0)
        if self._loop is not None and self._n.socket is not None:
            self._loop.remove_writer(self._n.socket.fileno())
        return True

    def _warn(self, msg: str) -> None:
        if not self._warned:
            self._warned = True
            logger.warning("{}", msg)

    # ---- the messages --------------------------------------------------------------------
    def ready(self, status: str | None = None) -> None:
        lines = ["READY=1"]
        if status is not None:
            lines.append(f"STATUS={one_line(status)}")
            self._last_status = one_line(status)
        self.send(*lines)
        post_darwin(DARWIN_READY_NAME)

    def status(self, text: str) -> None:
        text = one_line(text)
        if text != self._last_status:
            self._last_status = text
            self.send(f"STATUS={text}")

    def reloading(self) -> None:
        self.send("RELOADING=1", f"MONOTONIC_USEC={monotonic_usec()}", "STATUS=reloading")

    def stopping(self, status: str = "stopping") -> None:
        self.send("STOPPING=1", f"STATUS={one_line(status)}")

    def watchdog(self) -> None:
        self.send("WATCHDOG=1")

    def extend_timeout(self, seconds: float) -> None:
        self.send(f"EXTEND_TIMEOUT_USEC={int(seconds * 1e6)}")

    def errno(self, err: int, status: str) -> None:
        self.send(f"ERRNO={err}", f"STATUS={one_line(status)}")


def post_darwin(name: str) -> None:
    """notify_post(3) on macOS, the nearest thing launchd has to a readiness signal."""
    if sys.platform != "darwin":
        return
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("System") or "/usr/lib/libSystem.B.dylib")
        lib.notify_post(name.encode())
    except (OSError, AttributeError) as e:
        logger.debug("notify_post({}) failed: {}", name, e)
